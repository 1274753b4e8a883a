"""``echo-sd bench``: policies side by side on real prompts, selection quality, the projection.

Modules: :mod:`~echo_lab.bench.workloads` (prompt sets), :mod:`~echo_lab.bench.capture`
(per-step capture of a real engine), :mod:`~echo_lab.bench.oracle` (hindsight selection quality),
:mod:`~echo_lab.bench.metrics`, :mod:`~echo_lab.bench.harness` (one closed-loop run),
:mod:`~echo_lab.bench.suite` (every run + output comparison),
:mod:`~echo_lab.bench.report` (tables, JSON), :mod:`~echo_lab.bench.plots`,
:mod:`~echo_lab.bench.traces` and :mod:`~echo_lab.bench.projection` (simulator at scale).
"""
