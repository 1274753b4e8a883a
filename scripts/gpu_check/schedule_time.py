"""The policies' own scheduling time per step with their tensors on the device.

``packages/echo-scheduler/scripts/schedule_vs_gpu.py`` measured it with the policy on the CPU
(one torch thread): ECHO's host time was 10-42% of the measured H200 step. On a GPU the same
calls are kernel launches and device-to-host copies instead, so the number that matters is this
one: every (trace, B, arm) cell of :func:`echo_scheduler.replay.hosttime.host_rows` with the
policy working on pools on the device (recordings grown on the CPU, outside the clock) and the
device synchronized at the end of every policy call, inside the clock: an upper bound on the
time a serial host loop spends per step (queued work the next call would have overlapped is
counted too).

A second, untimed pass over ``COUNT_STEPS`` steps per cell counts the host syncs inside the
policy's calls (:class:`echo_core.testing.HostSyncCounter`; the count is the same on any device,
so the dry run on the CPU reports it too).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from echo_core.testing import HostSyncCounter
from echo_scheduler.replay.costs import load_profiled
from echo_scheduler.replay.hosttime import DEFAULT_ARMS, HEADER, host_rows

REPO = Path(__file__).resolve().parents[2]
GPU_COST = REPO / "traces" / "cost-gpu-h200-llama8b.json"
TRACES = tuple(sorted((REPO / "traces").glob("trace-*.json.gz")))
GPU_BATCHES = (16, 64, 256)
CPU_BATCHES = (16,)
COUNT_STEPS = 3


def _synchronizing(device: torch.device) -> Iterator[None]:
    yield
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    cells = [
        {
            "trace": r.trace,
            "batch": r.batch,
            "arm": r.arm,
            "host_ms": round(r.host_ms, 3),
            "cpu_ms": round(r.cpu_ms, 3),
            "gpu_ms": round(r.gpu_ms, 3),
            "share": round(r.share, 4),
            "rows_per_request": round(r.rows_per_request, 3),
            "tokens_per_s_gpu": round(r.tokens_per_s_gpu, 1),
            "tokens_per_s_serial": round(r.tokens_per_s_serial, 1),
            "syncs_per_step": s,
            "line": r.line() + f" {s:>7.1f}",
        }
        for r, s in zip(timed, syncs, strict=True)
    ]
    return {
        "device": str(device),
        "steps": steps,
        "cost_file": GPU_COST.name,
        "header": HEADER + f" {'syncs':>7}",
        "cells": cells,
        "ok": len(cells) == len(traces) * len(batches) * len(DEFAULT_ARMS),
    }
