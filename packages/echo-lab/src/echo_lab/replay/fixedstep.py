"""ECHO's fixed-layout step alone on the recorded pools: captured, re-run, timed, graph-captured.

:func:`capture_steps` replays ECHO's arm as ``echo_device`` (its decisions made by
:class:`~echo_scheduler.device.FixedEchoStep`, the same as ``echo``'s: the tests pin them)
through composed steps of one trace at batch B, the floor fed by a cost model as in the replay,
and keeps, per drafted step, the slabs the fixed step saw, the host's prices and the selection.
:func:`run_step` re-runs one captured step from its slabs on any device: the policy part of a
step with no host sync, what a drafter that drafts the fixed layout would run.
:func:`time_eager` times it as served, its prices loaded into held buffers (the device
synchronized at the end, median of ``reps``).
:class:`StepGraphs` serves steps from CUDA graphs, one per step shape (B, the slabs' shapes, the
mode, the budget's bucket (:func:`~echo_scheduler.device.echo_step.budget_bucket`, the static
bound of its top-k), the gate, whether a row price applies and whether the deepest slab closed
the step): a
step of a shape already captured is
copied into that graph's input buffers (slabs, caps, the :class:`~echo_scheduler.device.
StepScalars` holding its prices and its latency model's table) and replayed, so one graph
serves every step of its shape, across cost-model updates too.
On the CPU the same buffers are re-run eagerly (the reload logic, without a graph), or, with
``StepGraphs(compiled=True)``, by a ``torch.compile`` of the step over them (one per shape,
``fullgraph``: a graph break, such as a host read, fails the compile): the CPU's counterpart of
a graph, which fuses the step's few-microsecond ops into a handful of C++ loops. On CUDA,
``compiled`` captures the compiled step (inductor's Triton kernels) in the shape's graph.
"""

from __future__ import annotations

import itertools
import statistics
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import torch
from torch import Tensor

from echo_gating.policy import GatePolicy
from echo_lab.replay.arms import DEVICE_ARM, optional_arms
from echo_lab.replay.costs import ProfiledCost
from echo_lab.replay.run import calibrate_rows, compose_steps, replay_step, split_warmup
from echo_lab.sim.rows import load_rows
from echo_scheduler.config import PolicyConfig
from echo_scheduler.cost import LatencyModel, ProfileCost
from echo_scheduler.device import DepthSlab, FixedEchoStep, StepPrices, StepScalars
from echo_scheduler.device.adapter import DeviceEchoPolicy
from echo_scheduler.device.echo_step import budget_bucket, layout_rows
from echo_scheduler.elastic import ElasticFloor
from echo_scheduler.errors import PolicyError
from echo_scheduler.policies import make_policy


@dataclass(frozen=True, slots=True)
class CapturedStep:
    """One drafted step of ``echo_device``: its inputs and its selection ([B, S] bool).
    ``closed``: whether the policy folded the deepest slab as the last depth (the depth cap, or
    a mode that drafts depth 1 only); if not, it also decided there which entries to expand
    (none, or the source ran dry), and a re-run does that work too."""

    config: PolicyConfig
    gate: GatePolicy
    prices: StepPrices
    slabs: tuple[DepthSlab, ...]
    keep: Tensor
    closed: bool  # the policy folded the deepest slab as the last (no expansion decided)

    @property
    def depths(self) -> int:
        return len(self.slabs)

    @property
    def batch_size(self) -> int:
        return int(self.prices.caps.shape[0])

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
                             fixed.select(), fixed.closed)
            )  # fmt: skip
    return out


def run_step(step: CapturedStep, scalars: StepScalars | None = None) -> Tensor:
    """The fixed step's decisions over ``step``'s slabs: its selection, [B, S] bool.
    ``scalars``: buffers holding ``step``'s prices (default: fresh ones)."""
    fixed = FixedEchoStep(step.config, step.gate, step.prices, scalars)
    last = len(step.slabs) - 1
    for i, slab in enumerate(step.slabs):
        fixed.fold_depth(slab, last=i == last and step.closed)
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


def repriced(step: CapturedStep, latency: LatencyModel) -> CapturedStep:
    """``step`` with its row price's latency model replaced by ``latency`` (what a cost-model
    update changes), its selection ``keep`` left as recorded."""
    price = step.prices.row_price
    if price is None:
        raise ValueError("the step has no row price to re-price")
    return replace(step, prices=replace(step.prices, row_price=replace(price, latency=latency)))


STEEP = ProfileCost((1.0, 64.0, 512.0, 4096.0), (0.010, 0.016, 0.060, 0.400))
"""A verify curve much steeper than the measured H200 one's: a cost-model update that changes
some of the recorded steps' cuts (the re-pricing checks)."""


def time_eager(step: CapturedStep, reps: int = 5) -> float:
    """Median ms of a served eager step (after one warm-up run), synchronized on a GPU: the
    step's prices loaded into held :class:`~echo_scheduler.device.StepScalars` and
    :func:`run_step` on them, as ``DeviceEchoPolicy`` serves consecutive steps. The latency
    table is filled before timing: a served step refills it only when the cost model changes,
    and at B = 256 filling it alone costs about as much as a step on the CPU."""
    scalars = StepScalars.of(
        step.prices, step.prices.caps.device, layout_rows(step.config, step.batch_size)
    )
    return _time_loaded(step, scalars, lambda: run_step(step, scalars), reps)


def time_served(graphs: StepGraphs, step: CapturedStep, reps: int = 5) -> float:
    """Median ms of ``step`` served by its entry in ``graphs`` (captured, and with
    ``compiled`` compiled, when its shape is first seen; untimed): its inputs loaded once, then
    each timed run reloads the prices and replays, as :func:`time_eager` reloads them and runs
    the step. The copy of the slabs into the entry's buffers is not timed: a drafter of the
    fixed layout would write them there."""
    entry = graphs.prepare(step)
    return _time_loaded(step, entry.scalars, entry.replay, reps)


def _time_loaded(
    step: CapturedStep, scalars: StepScalars, run: Callable[[], Tensor], reps: int
) -> float:
    """Median ms of ``step``'s prices loaded into ``scalars`` and ``run`` (after one warm-up)."""

    def served() -> Tensor:
        scalars.load(step.prices)
        return run()

    served()
    return _median_ms(served, step.prices.caps.device, reps)


def shape_key(step: CapturedStep) -> tuple[object, ...]:
    """What one graph of the step bakes in (module docstring): equal keys, one graph. The gate
    enters by identity; the graph's entry keeps it alive (in its captured step), so an id is
    never reused while its graph exists. The latency model does not enter: the graph reads it
    from the scalars' table, which :meth:`~echo_scheduler.device.StepScalars.load` refills."""
    return (
        tuple(tuple(s.path.shape) for s in step.slabs),
        step.prices.explore_rows,
        budget_bucket(step.prices.budget),
        step.prices.row_price is None,
        step.closed,
        id(step.gate),
        step.config,
    )


@dataclass
class _Graphed:
    """One captured step shape: its input buffers, its graph (None on the CPU), its output.
    ``static.prices`` keeps the first step's numbers, which the ops never read (they read
    ``scalars``); only its caps tensor is a buffer."""

    static: CapturedStep
    scalars: StepScalars
    graph: torch.cuda.CUDAGraph | None
    keep: Tensor
    compiled: Callable[[], Tensor] | None = None  # the CPU's compiled step over the buffers

    def load(self, step: CapturedStep) -> None:
        """Copy ``step``'s inputs into the buffers (device-side copies and fills). A step of
        another budget bucket is refused: its selection's top-k would be cut short."""
        if budget_bucket(step.prices.budget) != budget_bucket(self.static.prices.budget):
            raise PolicyError(
                f"a graph built for budget {self.static.prices.budget} cannot serve budget "
                f"{step.prices.budget}: another bucket (budget_bucket)"
            )
        for mine, theirs in zip(self.static.slabs, step.slabs, strict=True):
            mine.path.copy_(theirs.path)
            mine.draft.copy_(theirs.draft)
            mine.valid.copy_(theirs.valid)
        self.static.prices.caps.copy_(step.prices.caps)
        self.scalars.load(step.prices)

    def replay(self) -> Tensor:
        if self.graph is not None:
            self.graph.replay()
        elif self.compiled is not None:
            self.keep = self.compiled()
        else:  # the CPU: the same buffers, re-run
            self.keep = run_step(self.static, self.scalars)
        return self.keep


class StepGraphs:
    """Captured steps served from one graph per :func:`shape_key` (module docstring).
    ``compiled``: serve each shape by a ``torch.compile`` of the step over its buffers
    (compiled when the shape is first seen: seconds per shape): on the CPU instead of
    re-running it eagerly, on CUDA captured in the shape's graph (inductor's fused kernels
    instead of one kernel per aten op)."""

    def __init__(self, compiled: bool = False) -> None:
        self.graphs: dict[tuple[object, ...], _Graphed] = {}
        self.compiled = compiled

    @property
    def captures(self) -> int:
        return len(self.graphs)

    def prepare(self, step: CapturedStep) -> _Graphed:
        """The graph serving ``step``, its buffers holding ``step``'s inputs."""
        key = shape_key(step)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(step)
        entry.load(step)
        return entry

    def run(self, step: CapturedStep) -> Tensor:
        """``step``'s selection by its graph (a copy of the graph's output buffer)."""
        return self.prepare(step).replay().clone()

    def time(self, step: CapturedStep, reps: int = 20) -> tuple[float, bool]:
        """(median ms of a replay serving ``step``, its selection equals the eager one)."""
        eager = run_step(step)
        entry = self.prepare(step)
        same = bool(torch.equal(entry.replay(), eager))
        device = step.prices.caps.device
        return _median_ms(entry.replay, device, reps), same

    def _capture(self, step: CapturedStep) -> _Graphed:
        device = step.prices.caps.device
        slabs = tuple(
            DepthSlab(s.path.clone(), s.draft.clone(), s.valid.clone()) for s in step.slabs
        )
        prices = replace(step.prices, caps=step.prices.caps.clone())
        static = replace(step, prices=prices, slabs=slabs)
        scalars = StepScalars.of(
            prices, device, layout_rows(step.config, int(prices.caps.shape[0]))
        )
        compiled = compiled_step(static, scalars) if self.compiled else None
        if device.type != "cuda":
            if compiled is None:
                return _Graphed(static, scalars, None, run_step(static, scalars))
            return _Graphed(static, scalars, None, compiled(), compiled)

        def run() -> Tensor:
            return run_step(static, scalars) if compiled is None else compiled()

        stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm up off the capture (allocator, map tables, compile)
            for _ in range(2):
                run()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            keep = run()
        return _Graphed(static, scalars, graph, keep, compiled)  # owns what its graph runs


def compiled_step(static: CapturedStep, scalars: StepScalars) -> Callable[[], Tensor]:
    """``run_step(static, scalars)`` compiled by ``torch.compile`` (``fullgraph``, static
    shapes) for the buffers' shape: calling it runs the step on whatever the buffers hold now.
    Compiles on its first call.

    Each call of this function compiles a copy of the step's code object under its own name:
    dynamo keeps its graphs per code object, at most ``recompile_limit`` (8) of them, and with
    ``fullgraph`` the ninth shape on one code object would raise; the shapes of a few cells
    reach that.

    On the CPU the compiled graph calls its kernels from a C++ wrapper (inductor's
    ``cpp_wrapper``), not from generated Python: the step is about 30 kernel and library calls
    of tens of microseconds each, and the Python wrapper's own time was about a tenth of it
    (docs/BENCHMARKS.md, "Kernels called from C++")."""

    def step() -> Tensor:
        return run_step(static, scalars)

    code = step.__code__.replace(co_name=f"fixed_step_{next(_COMPILED)}")
    fresh = types.FunctionType(code, step.__globals__, code.co_name, None, step.__closure__)
    cpu = static.prices.caps.device.type == "cpu"
    options: dict[str, str | int | bool | Callable[..., object]] | None = (
        {"cpp_wrapper": True} if cpu else None
    )
    compiled = torch.compile(fresh, dynamic=False, fullgraph=True, options=options)
    return cast(Callable[[], Tensor], compiled)


_COMPILED = itertools.count()
