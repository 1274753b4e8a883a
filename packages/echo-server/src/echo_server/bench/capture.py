"""Per-step capture of a real engine run, without touching the engine: two delegating wrappers.

:class:`CapturingDrafter` sees ``begin_step`` (the request ids in batch order and every context's
length, i.e. where the step's root sits) and :class:`CapturingPolicy` sees the rest of the step:
the budget and caps (``begin_step``), the full candidate pool and the selection (``select``) and
the accepted lengths (``observe``). Both write into one :class:`StepLog`, which turns each step
into a :class:`CapturedStep`. The policy wrapper also times the policy's own methods: that is
the *schedule* phase, which the engine's timer counts inside *draft*.

Install with :func:`attach` after building the engine; the wrapped objects behave exactly as
before (the benchmark's greedy outputs are compared against plain decoding to prove it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import Tensor

from echo_core.tree import TreeBatch
from echo_scheduler.interface import DraftPlan, Policy, StepBatch, StepOutcome
from echo_server.drafting.base import Drafter, ExpandRequest, Proposals, TargetFeedback
from echo_server.engine import Engine


@dataclass(frozen=True, slots=True)
class CapturedStep:
    """One decode step as the policy saw it, with the request ids the engine ran it for."""

    request_ids: tuple[str, ...]
    root_positions: tuple[int, ...]  # index of each request's root in prompt + output tokens
    budget: int  # K of the step
    max_nodes: Tensor  # [B] int64, per-request caps
    pool: TreeBatch  # everything drafted this step
    keep: Tensor  # [pool.num_nodes] bool, the verified selection
    accepted: Tensor  # [B] int64, accepted draft tokens per request (bonus not counted)
    schedule_s: float  # wall time inside the policy's methods


@dataclass(slots=True)
class StepLog:
    """Collects :class:`CapturedStep` objects from the two wrappers."""

    steps: list[CapturedStep] = field(default_factory=list)
    schedule_s: float = 0.0
    _ids: tuple[str, ...] = ()
    _positions: tuple[int, ...] = ()
    _batch: StepBatch | None = None
    _pool: TreeBatch | None = None
    _keep: Tensor | None = None
    _step_schedule_s: float = 0.0

    def on_begin(self, request_ids: Sequence[str], positions: Sequence[int]) -> None:
        self._ids, self._positions = tuple(request_ids), tuple(positions)
        self._batch = self._pool = self._keep = None
        self._step_schedule_s = 0.0

    def on_batch(self, batch: StepBatch) -> None:
        self._batch = batch

    def on_select(self, pool: TreeBatch, keep: Tensor) -> None:
        self._pool, self._keep = pool, keep

    def add_schedule_time(self, seconds: float) -> None:
        self._step_schedule_s += seconds
        self.schedule_s += seconds

    def on_observe(self, outcome: StepOutcome) -> None:
        if self._batch is None or self._pool is None or self._keep is None:
            raise RuntimeError("observe before begin_step/select: the capture lost a step")
        if len(self._ids) != self._pool.batch_size:
            raise RuntimeError(
                f"captured {len(self._ids)} request ids for a pool of {self._pool.batch_size}"
            )
        self.steps.append(
            CapturedStep(
                request_ids=self._ids,
                root_positions=self._positions,
                budget=self._batch.budget,
                max_nodes=self._batch.max_nodes,
                pool=self._pool,
                keep=self._keep,
                accepted=outcome.accepted_lengths,
                schedule_s=self._step_schedule_s,
            )
        )
        self._batch = self._pool = self._keep = None

    def drain(self) -> list[CapturedStep]:
        """The steps captured since the last drain."""
        out, self.steps = self.steps, []
        return out


class CapturingPolicy:
    """Delegates to ``inner``; records the step and times the policy's methods."""

    def __init__(self, inner: Policy, log: StepLog) -> None:
        self.inner, self.log = inner, log
        self.name = inner.name

    def begin_step(self, batch: StepBatch) -> DraftPlan:
        self.log.on_batch(batch)
        start = time.perf_counter()
        plan = self.inner.begin_step(batch)
        self.log.add_schedule_time(time.perf_counter() - start)
        return plan

    def after_depth(self, pool: TreeBatch) -> DraftPlan:
        start = time.perf_counter()
        plan = self.inner.after_depth(pool)
        self.log.add_schedule_time(time.perf_counter() - start)
        return plan

    def select(self, pool: TreeBatch) -> Tensor:
        start = time.perf_counter()
        keep = self.inner.select(pool)
        self.log.add_schedule_time(time.perf_counter() - start)
        self.log.on_select(pool, keep)
        return keep

    def observe(self, outcome: StepOutcome) -> None:
        self.inner.observe(outcome)
        self.log.on_observe(outcome)


class CapturingDrafter:
    """Delegates to ``inner``; tells the log which requests a step runs and where their roots
    are."""

    def __init__(self, inner: Drafter, log: StepLog) -> None:
        self.inner, self.log = inner, log
        self.name = inner.name
        self.aux_layers = inner.aux_layers

    def observe(self, feedback: TargetFeedback) -> None:
        self.inner.observe(feedback)

    def begin_step(self, contexts: Sequence[Sequence[int]], request_ids: Sequence[str]) -> None:
        self.log.on_begin(request_ids, [len(c) - 1 for c in contexts])
        self.inner.begin_step(contexts, request_ids)

    def expand(self, nodes: ExpandRequest) -> Proposals:
        return self.inner.expand(nodes)

    def release(self, request_id: str) -> None:
        self.inner.release(request_id)


def attach(engine: Engine) -> StepLog:
    """Wrap ``engine``'s policy and drafter; returns the log they fill."""
    log = StepLog()
    engine.policy = CapturingPolicy(engine.policy, log)
    engine.drafter = CapturingDrafter(engine.drafter, log)
    return log
