"""``echo-sd bench``: policies side by side on real prompts, selection quality, the projection.

Modules: :mod:`~echo_server.bench.workloads` (prompt sets), :mod:`~echo_server.bench.capture`
(per-step capture of a real engine), :mod:`~echo_server.bench.oracle` (hindsight selection quality),
:mod:`~echo_server.bench.metrics`, :mod:`~echo_server.bench.harness` (one closed-loop run),
:mod:`~echo_server.bench.suite` (every run + output comparison),
:mod:`~echo_server.bench.report` (tables, JSON), :mod:`~echo_server.bench.plots`,
:mod:`~echo_server.bench.traces` and :mod:`~echo_server.bench.projection` (simulator at scale).
"""
