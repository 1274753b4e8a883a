"""Trace-driven simulation: drive any policy through the engine's exact call sequence.

Per step: ``begin_step`` -> (draft, :func:`~echo_scheduler.pool.grow_pool`, ``after_depth``)* ->
``select`` -> ``select_nodes`` (validation) -> greedy acceptance against the step's target ->
``observe``. The engine's side of the contract is checked on every plan (expanded nodes distinct
and at the depth drafted last), the policy's on every selection (ancestor-closed, total <= K,
per request <= max_nodes).

Simulated time of a step: ``t = t_draft + t_verify(B + verified)`` with
``t_draft = calls * per_call_s + expansions * per_node_s`` (``calls`` = drafter forward passes,
one per depth; ``expansions`` = nodes (or roots) expanded); throughput = ``(B + accepted) / t``.
Diagnostics (the replay's definitions, :mod:`echo_lab.replay.hindsight`): ``selection``
= accepted / the best that as many verified rows could accept from the policy's own pool
(``min(N, sum_b min(L_b, max_nodes[b]))`` per step, :func:`echo_scheduler.outcome.oracle_accepted`
with the verified count ``N`` as the budget), and ``coverage`` = what its own pool left reachable /
what the step's drafter could reach at ``oracle_width`` (both capped per request). The cost-aware
bound ``eta`` lives in the replay (``echo-sd sim``); this synthetic simulator has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from echo_core.stats import AcceptanceTotals
from echo_core.tree import TreeBatch, empty_tree
from echo_scheduler.cost import VerifyCostModel
from echo_scheduler.device.driver import drive as drive_any
from echo_scheduler.driver import DrivenStep
from echo_scheduler.interface import DraftPlan, Policy, StepBatch, StepOutcome
from echo_scheduler.outcome import accepted_lengths, accepted_mask, oracle_accepted
from echo_scheduler.pool import Children, grow_pool


class SimStep(Protocol):
    """One recorded or synthetic decode step: a drafter and the target's continuation."""

    @property
    def target(self) -> Tensor: ...  # [B, D] int64

    @property
    def max_nodes(self) -> Tensor: ...  # [B] int64

    @property
    def batch_size(self) -> int: ...

    def draft(self, pool: TreeBatch, plan: DraftPlan) -> Children: ...

    def reachable(self, width: int) -> Tensor: ...  # [B] int64


@dataclass(frozen=True, slots=True)
class DraftCostModel:
    """``t_draft = calls * per_call_s + expansions * per_node_s`` (defaults: an EAGLE-3 head)."""

    per_call_s: float = 4e-4
    per_node_s: float = 1.5e-6

    def seconds(self, calls: int, expansions: int) -> float:
        return calls * self.per_call_s + expansions * self.per_node_s


@dataclass(frozen=True, slots=True)
class StepResult:
    accepted: int  # accepted draft tokens, whole batch (bonus tokens not counted)
    verified: int  # draft nodes verified
    calls: int  # drafter forward passes (depths drafted)
    expansions: int  # nodes expanded by the drafter
    pool_nodes: int  # candidates drafted
    own_best: int  # most accepted tokens as many verified rows could get from its own pool
    own_reach: int  # sum_b min(L_b in its own pool, max_nodes[b])
    reach: int  # sum_b min(L_b drafting oracle_width wide, max_nodes[b])
    schedule_s: float  # wall time inside the policy's methods


class SimSource:
    """A :class:`SimStep` as the driver's draft source."""

    def __init__(self, step: SimStep) -> None:
        self.step = step

    def grow(self, pool: TreeBatch, plan: DraftPlan) -> TreeBatch:
        return grow_pool(pool, self.step.draft(pool, plan))


class DeviceSource:
    """A :class:`SimSource` whose pools the policy sees on ``device``: the recording is grown on
    the CPU (its own copy of the pool, outside any policy clock) and each grown pool is moved
    to the device, so a benchmark times the policy's device work and nothing of the drafter's.
    Each call copies the plan to the host, a sync a real drafter on the device does not make."""

    def __init__(self, step: SimStep, device: torch.device) -> None:
        self.source = SimSource(step)
        self.device = device
        self._host: TreeBatch | None = None  # the CPU copy of the pool the policy holds

    def grow(self, pool: TreeBatch, plan: DraftPlan) -> TreeBatch:
        host = self._host if self._host is not None else empty_tree(pool.batch_size, "cpu")
        cpu = DraftPlan(
            root_topk=None if plan.root_topk is None else plan.root_topk.cpu(),
            expand=plan.expand.cpu(),
            topk=plan.topk.cpu(),
        )
        self._host = self.source.grow(host, cpu)
        return self._host.to(self.device)


def drive(
    policy: Policy,
    step: SimStep,
    budget: int,
    min_utility: float = 0.0,
    depth_price: float | None = None,
    node_price: float | None = None,
) -> DrivenStep:
    """One step through the policy driver (:func:`~echo_scheduler.device.driver.drive`: the
    fixed layout's loop for a policy that has one, else ``drive_step``, strict: a policy still
    drafting after ``MAX_DRAFT_DEPTH`` depths is an error).

    ``min_utility`` / ``depth_price`` / ``node_price``: the engine's elastic cost floor
    (echo_scheduler.elastic).
    """
    batch = StepBatch(
        step.batch_size,
        budget,
        step.max_nodes,
        min_utility,
        depth_price=depth_price,
        node_price=node_price,
    )
    return drive_any(policy, SimSource(step), batch, strict=True)


def run_step(
    policy: Policy,
    step: SimStep,
    budget: int,
    oracle_width: int,
    node_price: float | None = None,
) -> StepResult:
    """One step of ``policy`` on ``step`` with budget K, verified and fed back (``node_price``:
    tokens each expanded node must promise, as the engine's floor sets it)."""
    b = step.batch_size
    run = drive(policy, step, budget, node_price=node_price)
    pool, keep = run.pool, run.keep
    lengths = accepted_lengths(pool, keep, step.target)
    verified = torch.bincount(pool.request_index()[keep], minlength=b)
    policy.observe(StepOutcome(accepted_lengths=lengths, verified=verified))
    in_pool = torch.bincount(pool.request_index()[accepted_mask(pool, step.target)], minlength=b)
    reach = torch.minimum(step.reachable(oracle_width), step.max_nodes)
    return StepResult(
        accepted=int(lengths.sum()),
        verified=int(keep.sum()),
        calls=run.depths,
        expansions=run.expansions,
        pool_nodes=pool.num_nodes,
        own_best=oracle_accepted(in_pool, step.max_nodes, int(keep.sum())),
        own_reach=int(torch.minimum(in_pool, step.max_nodes).sum()),
        reach=int(reach.sum()),
        schedule_s=run.schedule_s,
    )


@dataclass(frozen=True, slots=True)
class Summary:
    """Per-step means of a policy on a list of steps, and its simulated throughput."""

    accepted: float
    verified: float
    pool_nodes: float
    draft_yield: float  # accepted / verified
    mat: float  # mean accepted length incl. the bonus token: 1 + accepted / B
    tokens_per_s: float
    selection: float  # accepted / best from its own pool with as many verified rows
    coverage: float  # reachable in its own pool / reachable by the drafter at oracle_width
    schedule_ms: float


def summarize(
    results: list[StepResult],
    batch_size: int,
    verify: VerifyCostModel,
    draft: DraftCostModel,
) -> Summary:
    """Aggregate ``results`` of one policy at one (B, K) (module docstring for the time model)."""
    n = max(len(results), 1)
    acc = sum(r.accepted for r in results)
    ver = sum(r.verified for r in results)
    best = sum(r.own_best for r in results)
    own = sum(r.own_reach for r in results)
    reach = sum(r.reach for r in results)
    t = sum(
        draft.seconds(r.calls, r.expansions) + verify.latency_at(batch_size + r.verified)
        for r in results
    )
    emitted = batch_size * len(results)
    totals = AcceptanceTotals(emitted, ver, acc)
    return Summary(
        accepted=acc / n,
        verified=ver / n,
        pool_nodes=sum(r.pool_nodes for r in results) / n,
        draft_yield=totals.draft_yield,
        mat=totals.mean_accepted_length,
        tokens_per_s=(emitted + acc) / t if t else 0.0,
        selection=acc / best if best else 1.0,
        coverage=own / reach if reach else 1.0,
        schedule_ms=1e3 * sum(r.schedule_s for r in results) / n,
    )
