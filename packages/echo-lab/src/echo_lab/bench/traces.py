"""Simulator traces from real runs: saved as echo-trace/1 files, one per workload.

Rows and batch composition live in :mod:`echo_lab.sim.rows` (the replay's input unit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from echo_lab.sim.rows import TraceRow, compose, load_rows, split_rows
from echo_lab.sim.trace import RecordedStep, save_trace

__all__ = ["TraceRow", "compose", "load_rows", "save_traces", "split_rows"]


def save_traces(
    traces: Mapping[str, Sequence[RecordedStep]], out_dir: Path, suffix: str = ".json"
) -> list[Path]:
    """``trace-<workload><suffix>`` per workload with recorded steps (``.json.gz``: gzipped)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, steps in traces.items():
        if steps:
            path = out_dir / f"trace-{name}{suffix}"
            save_trace(steps, path)
            paths.append(path)
    return paths
