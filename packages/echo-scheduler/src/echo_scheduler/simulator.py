"""Trace-driven simulation: drive any policy through the engine's exact call sequence.

Per step: ``begin_step`` -> (draft, :func:`~echo_scheduler.pool.grow_pool`, ``after_depth``)* ->
``select`` -> ``select_nodes`` (validation) -> greedy acceptance against the step's target ->
``observe``. The engine's side of the contract is checked on every plan (expanded nodes distinct
and at the depth drafted last), the policy's on every selection (ancestor-closed, total <= K,
per request <= max_nodes).

Simulated time of a step: ``t = t_draft + t_verify(B + verified)`` with
``t_draft = calls * per_call_s + expansions * per_node_s`` (``calls`` = drafter forward passes,
one per depth; ``expansions`` = nodes (or roots) expanded); throughput = ``(B + accepted) / t``.
The oracle (see :mod:`echo_scheduler.outcome`) verifies exactly its accepted nodes and drafts
them as one chain per request: ``calls = max_b L_b``, ``expansions`` = its accepted tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from echo_core.tree import TreeBatch, empty_tree, select_nodes
from echo_scheduler.cost import VerifyCostModel
from echo_scheduler.errors import PolicyError, TraceError
from echo_scheduler.interface import DraftPlan, Policy, StepBatch, StepOutcome
from echo_scheduler.outcome import accepted_lengths, accepted_mask, oracle_accepted
from echo_scheduler.pool import Children, grow_pool

MAX_DRAFT_CALLS = 64
"""A policy still drafting after this many depths is considered broken."""


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
    pool_oracle: int  # best possible accepted tokens from this policy's own pool, same K
    oracle: int  # best possible accepted tokens from the drafter, same K
    oracle_calls: int
    schedule_s: float  # wall time inside the policy's methods


@dataclass(frozen=True, slots=True)
class Drive:
    """What one step of a policy produced: the final pool, the selection, drafting effort."""

    pool: TreeBatch
    keep: Tensor  # [N] bool
    calls: int
    expansions: int
    schedule_s: float  # wall time inside the policy's methods
    schedule_cpu_s: float  # process CPU time inside them (robust to a shared machine)


def drive(
    policy: Policy,
    step: SimStep,
    budget: int,
    min_utility: float = 0.0,
    depth_price: float | None = None,
) -> Drive:
    """One step through the engine's call sequence (module docstring); checks both contracts.

    ``min_utility`` / ``depth_price``: the engine's elastic cost floor (echo_scheduler.elastic).
    """
    b = step.batch_size
    t0, c0 = time.perf_counter(), time.process_time()
    batch = StepBatch(b, budget, step.max_nodes, None, min_utility, depth_price)
    plan = policy.begin_step(batch)
    spent, cpu = time.perf_counter() - t0, time.process_time() - c0
    pool = empty_tree(b)
    calls = expansions = 0
    while not plan.done:
        _check_plan(pool, plan, calls)
        calls += 1
        roots = plan.root_topk
        expansions += int((roots > 0).sum()) if roots is not None else int(plan.expand.numel())
        pool = grow_pool(pool, step.draft(pool, plan))
        t0, c0 = time.perf_counter(), time.process_time()
        plan = policy.after_depth(pool)
        spent, cpu = spent + time.perf_counter() - t0, cpu + time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    keep = policy.select(pool)
    spent, cpu = spent + time.perf_counter() - t0, cpu + time.process_time() - c0
    check_selection(pool, keep, budget, step.max_nodes)
    return Drive(pool, keep, calls, expansions, spent, cpu)


def run_step(policy: Policy, step: SimStep, budget: int, oracle_width: int) -> StepResult:
    """One step of ``policy`` on ``step`` with budget K, verified and fed back."""
    b = step.batch_size
    run = drive(policy, step, budget)
    pool, keep = run.pool, run.keep
    lengths = accepted_lengths(pool, keep, step.target)
    verified = torch.bincount(pool.request_index()[keep], minlength=b)
    policy.observe(StepOutcome(accepted_lengths=lengths, verified=verified))
    in_pool = torch.bincount(pool.request_index()[accepted_mask(pool, step.target)], minlength=b)
    reach = torch.minimum(step.reachable(oracle_width), step.max_nodes)
    return StepResult(
        accepted=int(lengths.sum()),
        verified=int(keep.sum()),
        calls=run.calls,
        expansions=run.expansions,
        pool_nodes=pool.num_nodes,
        pool_oracle=oracle_accepted(in_pool, step.max_nodes, budget),
        oracle=oracle_accepted(reach, step.max_nodes, budget),
        oracle_calls=int(reach.max()) if b else 0,
        schedule_s=run.schedule_s,
    )


def check_selection(pool: TreeBatch, keep: Tensor, budget: int, max_nodes: Tensor) -> TreeBatch:
    """Raise unless ``keep`` is a legal selection; return the SuperTree."""
    tree = select_nodes(pool, keep)  # raises TreeError unless ancestor-closed
    if tree.num_nodes > budget:
        raise PolicyError(f"selected {tree.num_nodes} nodes, budget is {budget}")
    over = tree.nodes_per_request() > max_nodes
    if bool(over.any()):
        raise PolicyError(f"requests {over.nonzero().flatten().tolist()} exceed max_nodes")
    return tree


def _check_plan(pool: TreeBatch, plan: DraftPlan, calls: int) -> None:
    if calls >= MAX_DRAFT_CALLS:
        raise PolicyError(f"policy still drafting after {calls} depths")
    if plan.root_topk is not None:
        if calls != 0 or plan.root_topk.shape != (pool.batch_size,):
            raise TraceError("root_topk is legal on the first plan only, one entry per request")
        return
    e = plan.expand
    if calls == 0:
        raise TraceError("the first plan must draft the roots (root_topk)")
    if bool((e < 0).any() | (e >= pool.num_nodes).any()) or torch.unique(e).numel() != e.numel():
        raise TraceError(f"expand must hold distinct indices into the pool of {pool.num_nodes}")
    if bool((pool.depth[e] != calls).any()):
        raise TraceError(f"expanded nodes must sit at the depth drafted last ({calls})")


@dataclass(frozen=True, slots=True)
class Summary:
    """Per-step means of a policy on a list of steps, and its simulated throughput."""

    accepted: float
    verified: float
    pool_nodes: float
    draft_yield: float  # accepted / verified
    mat: float  # mean accepted length incl. the bonus token: 1 + accepted / B
    tokens_per_s: float
    oracle_ratio: float  # accepted / oracle accepted
    pool_ratio: float  # accepted / best from its own pool
    oracle_tokens_per_s: float
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
    orc = sum(r.oracle for r in results)
    t = sum(
        draft.seconds(r.calls, r.expansions) + verify.latency_at(batch_size + r.verified)
        for r in results
    )
    t_orc = sum(
        draft.seconds(r.oracle_calls, r.oracle) + verify.latency_at(batch_size + r.oracle)
        for r in results
    )
    emitted = batch_size * len(results)
    return Summary(
        accepted=acc / n,
        verified=ver / n,
        pool_nodes=sum(r.pool_nodes for r in results) / n,
        draft_yield=acc / ver if ver else 0.0,
        mat=1.0 + acc / max(emitted, 1),
        tokens_per_s=(emitted + acc) / t if t else 0.0,
        oracle_ratio=acc / orc if orc else 1.0,
        pool_ratio=acc / max(sum(r.pool_oracle for r in results), 1),
        oracle_tokens_per_s=(emitted + orc) / t_orc if t_orc else 0.0,
        schedule_ms=1e3 * sum(r.schedule_s for r in results) / n,
    )
