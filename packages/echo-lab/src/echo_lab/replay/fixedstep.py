"""ECHO's fixed-layout step alone on the recorded pools: captured, re-run, timed, graph-captured.

:func:`capture_steps` replays ECHO's arm as ``echo_device`` (its decisions made by
:class:`~echo_scheduler.device.FixedEchoStep`, the same as ``echo``'s: the tests pin them)
through composed steps of one trace at batch B, the floor fed by a cost model as in the replay,
and keeps, per drafted step, the slabs the fixed step saw, the host's prices and the selection.
:func:`run_step` re-runs one captured step from its slabs on any device: the policy part of a
step with no host sync, what a drafter that drafts the fixed layout would run.
:func:`time_eager` times it (the device synchronized at the end, median of ``reps``);
:func:`time_graph` captures it in a CUDA graph (prices baked in, inputs cloned into the graph's
own buffers), replays it, checks the replay's selection against the eager one and times the
replay.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from echo_gating.policy import GatePolicy
from echo_lab.replay.arms import DEVICE_ARM, optional_arms
from echo_lab.replay.costs import ProfiledCost
from echo_lab.replay.run import calibrate_rows, compose_steps, replay_step, split_warmup
from echo_lab.sim.rows import load_rows
from echo_scheduler.config import PolicyConfig
from echo_scheduler.device import DepthSlab, FixedEchoStep, StepPrices
from echo_scheduler.device.adapter import DeviceEchoPolicy
from echo_scheduler.elastic import ElasticFloor
from echo_scheduler.policies import make_policy


@dataclass(frozen=True, slots=True)
class CapturedStep:
    """One drafted step of ``echo_device``: its inputs and its selection ([B, S] bool)."""

    config: PolicyConfig
    gate: GatePolicy
    prices: StepPrices
    slabs: tuple[DepthSlab, ...]
    keep: Tensor

    @property
    def depths(self) -> int:
        return len(self.slabs)

    def to(self, device: torch.device) -> CapturedStep:
        """The same step with every tensor on ``device``."""
        slabs = tuple(
            DepthSlab(s.path.to(device), s.draft.to(device), s.valid.to(device)) for s in self.slabs
        )
        prices = replace(self.prices, caps=self.prices.caps.to(device))
        return replace(self, prices=prices, slabs=slabs, keep=self.keep.to(device))


def capture_steps(trace: Path, batch: int, steps: int, cost: ProfiledCost) -> list[CapturedStep]:
    """The drafted steps among ``steps`` composed steps of ``trace`` at ``batch`` (module
    docstring); the warm-up split, gates and composition are the replay's (seed 0)."""
    arm = next(a for a in optional_arms() if a.name == DEVICE_ARM)
    warm, rows = split_warmup(load_rows([trace]), 0.3, 0)
    gates = calibrate_rows(warm, 8)
    policy = make_policy(arm.policy, arm.config, gate=gates[arm.gate] if arm.gate else None)
    assert isinstance(policy, DeviceEchoPolicy)
    floor = ElasticFloor(cost.verify_model(batch))
    serials: dict[str, int] = {}
    out = []
    for st in compose_steps(rows, batch, steps, 0):
        replay_step(policy, st, arm.budget(batch), floor, cost, serials)
        fixed = policy.fixed
        if fixed is not None and fixed.slabs:
            out.append(
                CapturedStep(fixed.config, fixed.gate, fixed.prices, tuple(fixed.slabs),
                             fixed.select())
            )  # fmt: skip
    return out


def run_step(step: CapturedStep) -> Tensor:
    """The fixed step's decisions over ``step``'s slabs: its selection, [B, S] bool."""
    fixed = FixedEchoStep(step.config, step.gate, step.prices)
    last = len(step.slabs) - 1
    for i, slab in enumerate(step.slabs):
        fixed.fold_depth(slab, last=i == last)
    return fixed.select()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def time_eager(step: CapturedStep, reps: int = 5) -> float:
    """Median ms of :func:`run_step` (after one warm-up run), synchronized on a GPU."""
    device = step.prices.caps.device
    run_step(step)
    return _median_ms(lambda: run_step(step), device, reps)


def time_graph(step: CapturedStep, reps: int = 20) -> tuple[float, bool]:
    """(median ms of a CUDA-graph replay of :func:`run_step`, the replay's selection equals
    the eager one). The step must be on a CUDA device. Its slabs are cloned into the graph's
    own input buffers and its prices are baked into the graph, so the check says the capture
    recorded the whole step, not that one graph serves other steps (that needs the prices as
    device scalars)."""
    device = step.prices.caps.device
    static = replace(step, slabs=tuple(
        DepthSlab(s.path.clone(), s.draft.clone(), s.valid.clone()) for s in step.slabs
    ))  # fmt: skip
    eager = run_step(static)
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):  # warm up off the capture (allocator, cached map tables)
        for _ in range(2):
            run_step(static)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        keep = run_step(static)
    graph.replay()
    _sync(device)
    same = bool(torch.equal(keep, eager))
    return _median_ms(graph.replay, device, reps), same
