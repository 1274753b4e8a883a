"""A policy's own scheduling time per step on the recorded pools, beside a measured GPU step.

The replay (``echo-sd sim``) prices a step by the model's work alone: its cost models leave the
policy's own time out. :func:`host_rows` measures that time on the same recorded pools: each arm
is driven through ``steps`` composed batches per (trace, B) by the replay's own
:func:`~echo_lab.replay.run.replay_step` (the floor's ``step_batch``,
:func:`~echo_scheduler.device.driver.drive`, ``observe`` and the floor's ``observe``), which times
every call of the policy and the floor (wall and process CPU) and leaves out the recorded pool's
growth (the drafter's work) and greedy acceptance (the verify's). For ``echo_device`` the
conversion between the packed pool and its slabs (:class:`~echo_scheduler.device.packed.
PackedSlabs`' clock) is counted in, but ``around`` does not wrap it: its reads are the packed
source's. With ``device`` the policy
works on pools there (:class:`~echo_scheduler.simulator.DeviceSource`); ``around`` wraps every
policy call (a benchmark on a GPU synchronizes the device on its exit, so the wall time holds the
device work the call queued).

Per cell: the median over steps (the first step of each arm warms the allocator and is dropped)
of the host time, next to the measured GPU step at that step's rows (verify + draft seconds of
the profiled cost model):

    share = host ms / (verify ms + draft ms)

and two rates: ``gpu`` = sum(B + accepted) / sum(verify + draft seconds) over every step (the
replay's ``tokens_per_s`` under that cost model: the same steps and decisions, a check), and
``serial`` = the same over the steps after the first with each step's host time added, as if
the host ran serially with the device.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from echo_lab.replay.arms import default_arms, optional_arms, select_arms
from echo_lab.replay.costs import ProfiledCost
from echo_lab.replay.run import calibrate_rows, compose_steps, replay_step, split_warmup
from echo_lab.sim.rows import load_rows
from echo_scheduler.driver import Around
from echo_scheduler.elastic import ElasticFloor
from echo_scheduler.policies import make_policy

DEFAULT_ARMS = ("echo", "chain/n=1", "eagle2/n=4", "static/2")
"""ECHO and the fixed arms that win some cell of the measured H200 replay."""

FIXED_ARMS = tuple(a.name for a in default_arms() if not a.name.startswith("echo_"))
"""ECHO, plain decoding and every fixed arm of the replay's grid (each budget): the arms
:func:`echo_vs_best` compares ECHO with."""


@dataclass(frozen=True, slots=True)
class HostRow:
    """One (trace, B, arm) cell of :func:`host_rows` (module docstring)."""

    trace: str
    batch: int
    arm: str
    host_ms: float  # median wall ms per step in the policy's and the floor's calls
    cpu_ms: float  # median process CPU ms of the same calls
    gpu_ms: float  # median modelled GPU step ms (verify + draft)
    rows_per_request: float  # mean verified draft rows per request
    tokens_per_s_gpu: float  # every step, GPU time only
    tokens_per_s_serial: float  # steps after the first, host time added

    @property
    def share(self) -> float:
        return self.host_ms / self.gpu_ms if self.gpu_ms > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The cell as JSON-ready, rounded values (with ``share`` and the printed ``line``)."""
        return {
            "trace": self.trace,
            "batch": self.batch,
            "arm": self.arm,
            "host_ms": round(self.host_ms, 3),
            "cpu_ms": round(self.cpu_ms, 3),
            "gpu_ms": round(self.gpu_ms, 3),
            "share": round(self.share, 4),
            "rows_per_request": round(self.rows_per_request, 3),
            "tokens_per_s_gpu": round(self.tokens_per_s_gpu, 1),
            "tokens_per_s_serial": round(self.tokens_per_s_serial, 1),
            "line": self.line(),
        }

    def line(self) -> str:
        return (
            f"{self.trace:<10} {self.batch:>4} {self.arm:<11} {self.host_ms:>8.2f} "
            f"{self.cpu_ms:>7.2f} {self.gpu_ms:>7.2f} {self.share:>6.1%} "
            f"{self.rows_per_request:>8.2f} {self.tokens_per_s_gpu:>10.1f} "
            f"{self.tokens_per_s_serial:>9.1f}"
        )


HEADER = (
    f"{'trace':<10} {'B':>4} {'arm':<11} {'host ms':>8} {'cpu ms':>7} {'gpu ms':>7} "
    f"{'share':>6} {'rows/req':>8} {'tok/s gpu':>10} {'+host':>9}"
)


def add_cell_arguments(p: argparse.ArgumentParser, repo: Path) -> None:
    """The arguments every script over :func:`host_rows`' cells takes: ``--traces`` (the
    repository's recorded traces), ``--gpu-cost`` (the measured H200 step), ``--batches`` and
    ``--arms``."""
    traces = repo / "traces"
    p.add_argument("--traces", type=Path, nargs="+", default=sorted(traces.glob("trace-*.json.gz")))
    p.add_argument("--gpu-cost", type=Path, default=traces / "cost-gpu-h200-llama8b.json")
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS))


def host_rows(
    traces: Sequence[Path],
    batches: Sequence[int],
    arm_names: Sequence[str],
    cost: ProfiledCost,
    steps: int = 20,
    device: torch.device | None = None,
    around: Around | None = None,
) -> Iterator[HostRow]:
    """Every (trace, B, arm) cell in that order (module docstring); ``steps`` >= 2."""
    if steps < 2:
        raise ValueError(f"steps must be >= 2 (the first is dropped), got {steps}")
    every = default_arms() + optional_arms()
    arms = [a for a in select_arms(every, list(arm_names)) if a.name in arm_names]
    for path in traces:
        name = path.name.removeprefix("trace-").split(".")[0]
        warm, rows = split_warmup(load_rows([path]), 0.3, 0)
        gates = calibrate_rows(warm, 8)
        for b in batches:
            composed = compose_steps(rows, b, steps, 0)
            for arm in arms:
                gate = gates[arm.gate] if arm.gate is not None else None
                policy = make_policy(arm.policy, arm.config, gate=gate)
                floor = ElasticFloor(cost.verify_model(b)) if arm.floor else None
                host: list[float] = []
                cpu: list[float] = []
                gpu: list[float] = []
                per_req: list[float] = []
                tokens: list[int] = []
                all_tokens = all_gpu = 0.0
                serials: dict[str, int] = {}
                for i, st in enumerate(composed):
                    step = replay_step(
                        policy, st, arm.budget(b), floor, cost, serials, device, around
                    )
                    ver, acc = int(step.verified.sum()), int(step.lengths.sum())
                    run = step.run
                    gpu_s = cost.verify_s(b, b + ver) + cost.draft_s(b, run.depths, run.expansions)
                    all_tokens += b + acc
                    all_gpu += gpu_s
                    if i:
                        tokens.append(b + acc)
                        host.append(step.host_s)
                        cpu.append(step.host_cpu_s)
                        gpu.append(gpu_s)
                        per_req.append(ver / b)
                yield HostRow(
                    trace=name,
                    batch=b,
                    arm=arm.name,
                    host_ms=1e3 * statistics.median(host),
                    cpu_ms=1e3 * statistics.median(cpu),
                    gpu_ms=1e3 * statistics.median(gpu),
                    rows_per_request=statistics.mean(per_req),
                    tokens_per_s_gpu=all_tokens / all_gpu,
                    tokens_per_s_serial=sum(tokens) / (sum(gpu) + sum(host)),
                )


def echo_vs_best(rows: Sequence[HostRow]) -> list[dict[str, Any]]:
    """Per (trace, B): ECHO's rate over the best other arm's, GPU time only and host-serial
    (each arm with its own host time; the best arm is picked separately for each), and the host
    ms per step at which ECHO would break even with that arm, ``g (R_gpu / R_best - 1)`` (``g``
    ECHO's median GPU step, ``R_gpu`` its GPU-only rate, ``R_best`` the best host-serial rate:
    approximate, since it prices the median step)."""
    out = []
    for trace, batch in dict.fromkeys((r.trace, r.batch) for r in rows):
        cell = [r for r in rows if (r.trace, r.batch) == (trace, batch)]
        echo = next((r for r in cell if r.arm == "echo"), None)
        others = [r for r in cell if r.arm != "echo"]
        if echo is None or not others:
            continue
        gpu = max(others, key=lambda r: r.tokens_per_s_gpu)
        serial = max(others, key=lambda r: r.tokens_per_s_serial)
        out.append(
            {
                "trace": trace,
                "batch": batch,
                "gpu_only": round(echo.tokens_per_s_gpu / gpu.tokens_per_s_gpu, 4),
                "gpu_best": gpu.arm,
                "host_serial": round(echo.tokens_per_s_serial / serial.tokens_per_s_serial, 4),
                "serial_best": serial.arm,
                "echo_host_ms": round(echo.host_ms, 3),
                "best_host_ms": round(serial.host_ms, 3),
                "break_even_ms": round(
                    echo.gpu_ms * (echo.tokens_per_s_gpu / serial.tokens_per_s_serial - 1), 3
                ),
            }
        )
    return out


def format_comparison(cell: dict[str, Any]) -> str:
    """One :func:`echo_vs_best` cell as a line."""
    return (
        f"  {cell['trace']:<10} B={cell['batch']:>3}: echo / best other, GPU only "
        f"{cell['gpu_only']:.3f} ({cell['gpu_best']}), host-serial {cell['host_serial']:.3f} "
        f"({cell['serial_best']}); host ms echo {cell['echo_host_ms']}, best "
        f"{cell['best_host_ms']}, break-even {cell['break_even_ms']}"
    )
