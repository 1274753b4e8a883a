"""The gRPC control plane: the generation API of a serving node and the budget controller.

Node side: :mod:`.engine_thread` (the one thread that owns the engine), :mod:`.generation_service`
(Generate, GenerateStream, GetStats), :mod:`.lease_client` (register, report, watch leases),
:mod:`.node` (the ``echo-sd serve`` process). Controller side: :mod:`.lease_table` (the budget
split and its invariant, pure), :mod:`.calibration_pool` (shared gate calibration),
:mod:`.controller` (the ``echo-sd controller`` process). Shared: :mod:`.convert` (the only
module that maps proto <-> core types), :mod:`.security` (TLS, bearer tokens, limits),
:mod:`.metrics` (Prometheus).
"""
