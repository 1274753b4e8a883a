"""ECHO's fixed-layout step on the device, eager and in a CUDA graph (issue #44).

Per (trace, B): the drafted steps of ``echo_device`` on the recorded pools are captured on the
CPU (:func:`echo_lab.replay.fixedstep.capture_steps`; the replay, its floor fed by the measured
H200 step model) and moved to the device. For each step the policy part (after every depth, the
selection) runs eagerly, synchronized (``eager_ms``), its host syncs counted (must be 0) and its
selection compared with the CPU's. Then it is served by
:class:`echo_lab.replay.fixedstep.StepGraphs`: one CUDA graph per step shape, captured at the
shape's first step, its input buffers (slabs, caps, prices) reloaded for every later step of
that shape and replayed (``graph_ms``, ``graph_same``: each replay's selection equals the eager
one; ``graphs``: graphs captured for the cell's ``steps``). Then every step, re-priced by another
verify curve (a cost-model update, :data:`~echo_lab.replay.fixedstep.STEEP`), is served by the
same graphs (``repriced_same``: each selects what a fresh eager step under the new curve selects,
and no graph was added; ``repriced_changed``: steps whose selection the new curve changed, so
that the check is not vacuous). Medians over steps. The dry run (CPU)
runs the eager part and the buffers' reload (re-run eagerly, no graph) at one batch size on one
trace.

:func:`run_fixed_compiled` (the ``fixed-compiled`` part) serves the same steps by
``StepGraphs(compiled=True)``: one ``torch.compile`` of the step per shape (inductor's fused
kernels; on CUDA captured in the shape's graph), compiled at the shape's first step
(``compile_s``, all shapes), each selection compared with the eager one (``compiled_same``), the
replays timed with the prices reloaded each run (``compiled_ms``, :func:`~echo_lab.replay.
fixedstep.time_served`) beside the eager step, which reloads them too (``eager_ms``).
Compiling takes seconds per shape, so the GPU run covers B = 256 on one trace.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch
from gpu_check.schedule_time import CPU_BATCHES, GPU_BATCHES, GPU_COST, TRACES

from echo_core.testing import HostSyncCounter
from echo_lab.replay.costs import load_profiled
from echo_lab.replay.fixedstep import (
    STEEP,
    StepGraphs,
    capture_steps,
    repriced,
    run_step,
    time_eager,
    time_served,
)

__all__ = [
    "COMPILED_BATCHES",
    "CPU_BATCHES",
    "GPU_BATCHES",
    "TRACES",
    "format_cells",
    "format_compiled",
    "run_fixed_compiled",
    "run_fixed_step",
]

STEPS = 12
COMPILED_BATCHES = (256,)
"""The compiled part's batch on the GPU: issue #44's goal (0.1 ms a step at B = 256)."""


def run_fixed_step(
    device: torch.device,
    batches: tuple[int, ...],
    steps: int = STEPS,
    traces: tuple[Path, ...] = TRACES,
) -> dict[str, Any]:
    """The cells of the module docstring as a JSON-ready dict; ``ok`` when every step made no
    host sync and every selection matched (the CPU's, and on CUDA the graph replay's)."""
    cost = load_profiled(GPU_COST, "gpu")
    cells = []
    ok = True
    for trace in traces:
        name = trace.name.removeprefix("trace-").split(".")[0]
        for b in batches:
            captured = capture_steps(trace, b, steps, cost)
            eager, graph, syncs, depths = [], [], [], []
            same = graph_same = True
            graphs = StepGraphs()
            for step in (s.to(device) for s in captured):
                with HostSyncCounter(device_only=device.type != "cpu") as counter:
                    keep = run_step(step)
                syncs.append(counter.total)
                same &= bool(torch.equal(keep.cpu(), step.keep.cpu()))
                eager.append(time_eager(step))
                depths.append(step.depths)
                ms, equal = graphs.time(step, reps=20 if device.type == "cuda" else 1)
                graph_same &= equal
                if device.type == "cuda":
                    graph.append(ms)
            captures = graphs.captures
            reprice_same, changed = True, 0
            for step in captured:
                if step.prices.row_price is None:
                    continue
                other = repriced(step.to(device), STEEP)
                fresh = run_step(other)
                reprice_same &= bool(torch.equal(graphs.run(other), fresh))
                changed += not bool(torch.equal(fresh.cpu(), step.keep.cpu()))
            reprice_same &= graphs.captures == captures
            cell = {
                "trace": name,
                "batch": b,
                "steps": len(captured),
                "depths": round(statistics.mean(depths), 2) if depths else 0.0,
                "syncs_max": max(syncs, default=0),
                "same_as_cpu": same,
                "eager_ms": round(statistics.median(eager), 4) if eager else None,
                "graph_ms": round(statistics.median(graph), 4) if graph else None,
                "graph_same": graph_same,
                "graphs": captures,
                "repriced_same": reprice_same,
                "repriced_changed": changed,
            }
            ok &= same and graph_same and reprice_same and cell["syncs_max"] == 0
            cells.append(cell)
    return {"device": str(device), "cost_file": GPU_COST.name, "cells": cells, "ok": ok}


def format_cells(result: dict[str, Any]) -> list[str]:
    """One printed line per cell."""
    lines = [f"{'trace':<10} {'B':>4} {'steps':>5} {'depths':>6} {'syncs':>5} {'same':>4} "
             f"{'eager ms':>9} {'graph ms':>9} {'graph ok':>8} {'graphs':>6} "
             f"{'repriced':>8} {'changed':>7}"]  # fmt: skip
    for c in result["cells"]:
        lines.append(
            f"{c['trace']:<10} {c['batch']:>4} {c['steps']:>5} {c['depths']:>6} "
            f"{c['syncs_max']:>5} {'yes' if c['same_as_cpu'] else 'NO':>4} "
            f"{c['eager_ms'] if c['eager_ms'] is not None else '-':>9} "
            f"{c['graph_ms'] if c['graph_ms'] is not None else '-':>9} "
            f"{c['graph_same']!s:>8} {c['graphs']:>6} {c['repriced_same']!s:>8} "
            f"{c['repriced_changed']:>7}"
        )
    return lines


def run_fixed_compiled(
    device: torch.device,
    batches: tuple[int, ...],
    steps: int = STEPS,
    traces: tuple[Path, ...] = TRACES[:1],
) -> dict[str, Any]:
    """The compiled cells of the module docstring as a JSON-ready dict; ``ok`` when every
    compiled selection equals the eager one."""
    cost = load_profiled(GPU_COST, "gpu")
    reps = 20 if device.type == "cuda" else 1
    cells = []
    ok = True
    for trace in traces:
        name = trace.name.removeprefix("trace-").split(".")[0]
        for b in batches:
            captured = [s.to(device) for s in capture_steps(trace, b, steps, cost)]
            graphs = StepGraphs(compiled=True)
            began = time.perf_counter()
            for step in captured:
                graphs.prepare(step)
            compile_s = time.perf_counter() - began
            eager, compiled, same = [], [], True
            for step in captured:
                eager.append(time_eager(step, reps=reps))
                same &= graphs.time(step, reps=1)[1]
                compiled.append(time_served(graphs, step, reps=reps))  # prices reloaded, as eager
            cells.append({
                "trace": name,
                "batch": b,
                "steps": len(captured),
                "graphs": graphs.captures,
                "compile_s": round(compile_s, 2),
                "eager_ms": round(statistics.median(eager), 4) if eager else None,
                "compiled_ms": round(statistics.median(compiled), 4) if compiled else None,
                "compiled_same": same,
            })  # fmt: skip
            ok &= same
    return {"device": str(device), "cost_file": GPU_COST.name, "cells": cells, "ok": ok}


def format_compiled(result: dict[str, Any]) -> list[str]:
    """One printed line per compiled cell."""
    lines = [f"{'trace':<10} {'B':>4} {'steps':>5} {'graphs':>6} {'compile s':>9} "
             f"{'eager ms':>9} {'comp ms':>9} {'same':>5}"]  # fmt: skip
    for c in result["cells"]:
        lines.append(
            f"{c['trace']:<10} {c['batch']:>4} {c['steps']:>5} {c['graphs']:>6} "
            f"{c['compile_s']:>9} {c['eager_ms'] if c['eager_ms'] is not None else '-':>9} "
            f"{c['compiled_ms'] if c['compiled_ms'] is not None else '-':>9} "
            f"{'yes' if c['compiled_same'] else 'NO':>5}"
        )
    return lines
