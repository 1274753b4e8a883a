"""The serving node, free of transports: the one engine thread, the drift observer its step
reports feed, the node's stats and metrics, and the budget-protocol values it follows.

:mod:`.node` (the :class:`~echo_server.node.node.Node`), :mod:`.engine_thread` (the one thread
that owns the engine), :mod:`.drift` (the gate observer, a StepReport consumer), :mod:`.stats`
(the stats window), :mod:`.items` (what a request's stream carries), :mod:`.limits` (what a
request may ask), :mod:`.errors` (admission refusals), :mod:`.lease` and :mod:`.identity` (the
node's side of the budget protocol, as values), :mod:`.utility` (the marginal-utility curve it
reports), :mod:`.metrics` (Prometheus). The gRPC (:mod:`echo_server.grpc`) and HTTP
(:mod:`echo_server.http`) APIs adapt it; ``echo-sd serve`` assembles the process.
"""
