"""The policies' own scheduling time per step with their tensors on the device.

``packages/echo-lab/scripts/schedule_vs_gpu.py`` measured it with the policy on the CPU
(one torch thread): ECHO's host time was 10-42% of the measured H200 step. On a GPU the same
calls are kernel launches and device-to-host copies instead, so the number that matters is this
one: every (trace, B, arm) cell of :func:`echo_lab.replay.hosttime.host_rows` with the
policy working on pools on the device (recordings grown on the CPU, outside the clock) and the
device synchronized at the end of every policy call, inside the clock: an upper bound on the
time a serial host loop spends per step (queued work the next call would have overlapped is
counted too).

A second, untimed pass over ``COUNT_STEPS`` steps per cell counts the host syncs inside the
policy's calls (:class:`echo_core.testing.HostSyncCounter`; the count is the same on any device,
so the dry run on the CPU reports it too).

The alternative is to keep the policy on the host: a third pass runs the same cells with the
pools on the CPU (one torch thread, the GPU machine's own CPU), and :func:`transfer_times` times
what that mode adds per step: copying each drafted depth's pool to the host and the selected
tree back (``TreeBatch.to``, synchronized, median of ``TRANSFER_REPS``).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from echo_core.testing import HostSyncCounter
from echo_core.tree import TreeBatch
from echo_lab.bench.intervals import cpu_name
from echo_lab.replay.costs import load_profiled
from echo_lab.replay.hosttime import (
    DEFAULT_ARMS,
    FIXED_ARMS,
    HEADER,
    echo_vs_best,
    host_rows,
)

REPO = Path(__file__).resolve().parents[2]
GPU_COST = REPO / "traces" / "cost-gpu-h200-llama8b.json"
TRACES = tuple(sorted((REPO / "traces").glob("trace-*.json.gz")))
GPU_BATCHES = (16, 64, 256)
CPU_BATCHES = (16,)
COUNT_STEPS = 3
HOST_ARMS = FIXED_ARMS
"""The host pass drives ECHO and every fixed arm of the replay (each budget of its grid), so the
best fixed arm with its own host time is the replay's best, not one of three."""
TRANSFER_NODES = (256, 1024, 4096, 8192)
TRANSFER_REPS = 50


def _tree(nodes: int, batch: int, device: torch.device) -> TreeBatch:
    """A chain-per-request pool of ``nodes`` nodes over ``batch`` requests (shape only)."""
    per = torch.full((batch,), nodes // batch, dtype=torch.int64)
    per[: nodes % batch] += 1
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), per.cumsum(0)])
    local = torch.arange(nodes) - torch.repeat_interleave(cu[:-1], per)
    lp = torch.full((nodes,), -0.5)
    return TreeBatch(
        cu, torch.zeros(nodes, dtype=torch.int64), local - 1, local + 1, lp, lp.clone()
    ).to(device)


def transfer_times(device: torch.device, reps: int = TRANSFER_REPS) -> dict[str, Any]:
    """Median ms of a pool's device-to-host and host-to-device copy per node count (B = 256)."""
    out: dict[str, Any] = {}
    for n in TRANSFER_NODES:
        on_device, on_host = _tree(n, 256, device), _tree(n, 256, torch.device("cpu"))
        d2h: list[float] = []
        h2d: list[float] = []
        for _ in range(reps):
            _sync(device)
            t0 = time.perf_counter()
            on_device.to("cpu")
            _sync(device)
            t1 = time.perf_counter()
            on_host.to(device)
            _sync(device)
            d2h.append(t1 - t0)
            h2d.append(time.perf_counter() - t1)
        out[str(n)] = {
            "d2h_ms": round(1e3 * statistics.median(d2h), 4),
            "h2d_ms": round(1e3 * statistics.median(h2d), 4),
        }
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _synchronizing(device: torch.device) -> Iterator[None]:
    yield
    _sync(device)


def run_schedule_time(
    device: torch.device, batches: tuple[int, ...], steps: int, traces: tuple[Path, ...] = TRACES
) -> dict[str, Any]:
    """Timed and counted cells (module docstring) as a JSON-ready dict; ``ok`` when every cell
    ran."""
    cost = load_profiled(GPU_COST, "gpu")
    synced = contextlib.contextmanager(lambda: _synchronizing(device))
    timed = list(host_rows(traces, batches, DEFAULT_ARMS, cost, steps, device, synced))
    counter = HostSyncCounter()
    syncs: list[float] = []
    for _row in host_rows(
        traces, batches, DEFAULT_ARMS, cost, COUNT_STEPS, device, lambda: counter
    ):
        syncs.append(counter.total / COUNT_STEPS)
        counter.counts.clear()
        counter.sites.clear()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        on_host = list(host_rows(traces, batches, HOST_ARMS, cost, steps))
    finally:
        torch.set_num_threads(threads)
    cells = [
        {**r.as_dict(), "syncs_per_step": s, "line": r.line() + f" {s:>7.1f}"}
        for r, s in zip(timed, syncs, strict=True)
    ]
    host_cells = [r.as_dict() for r in on_host]
    return {
        "device": str(device),
        "host_cpu": cpu_name(),
        "steps": steps,
        "cost_file": GPU_COST.name,
        "header": HEADER + f" {'syncs':>7}",
        "cells": cells,
        "host_cells": host_cells,
        "transfer": transfer_times(device, TRANSFER_REPS if device.type == "cuda" else 2),
        "echo_vs_best": echo_vs_best(on_host),
        "ok": len(cells) == len(traces) * len(batches) * len(DEFAULT_ARMS)
        and len(host_cells) == len(traces) * len(batches) * len(HOST_ARMS),
    }
