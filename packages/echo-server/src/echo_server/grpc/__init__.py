"""The serving node's gRPC control plane: the generation API and the node's side of the budget
protocol.

:mod:`.engine_thread` (the one thread that owns the engine), :mod:`.generation_service`
(Generate, GenerateStream, GetStats), :mod:`.lease_client` (register, report, watch leases),
:mod:`.node` (the ``echo-sd serve`` process), :mod:`.convert` (the node's proto <-> core
mapping), :mod:`.metrics` (Prometheus). The budget controller is its own package, echo-controller
(``echo_controller``: no torch), which also holds the torch-free pieces both processes share:
the gRPC server, TLS and bearer tokens, the budget-protocol errors and conversions.
"""
