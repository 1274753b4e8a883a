"""The serving node's gRPC adapter: the generation API and the node's side of the budget
protocol, over the transport-free node (:mod:`echo_server.node`).

:mod:`.generation_service` (Generate, GenerateStream, GetStats), :mod:`.lease_client` (register,
report, watch leases: the node's lease follower), :mod:`.convert` (the node's proto <-> core
mapping), :mod:`.backoff`. The process (``echo-sd serve``) is assembled by
:mod:`echo_server.cli.serve`. The budget controller is its own package, echo-controller
(``echo_controller``: no torch), which also holds the torch-free pieces both processes share:
the gRPC server, TLS and bearer tokens, the budget-protocol errors and conversions.
"""
