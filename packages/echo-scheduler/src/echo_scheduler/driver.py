"""The policy driver: one decode step's draft-and-select loop over packed pools, its only copy.

The engine, the simulator, the replay and the SGLang selection replay all reach
:func:`drive_step` (the first three through :func:`echo_scheduler.device.driver.drive`, which
sends a policy with a fixed layout, ``echo_device``, to that layout's own loop instead); they
differ only in their :class:`DraftSource` (a drafter model, a recorded/synthetic step, a pool
that SGLang's EAGLE worker already drafted). One step::

    plan = policy.begin_step(batch)
    pool = empty_tree(B)
    while not plan.done and depths < max_depth:
        check_plan(pool, plan, depths)          # the driver's side of the contract
        grown = source.grow(pool, plan)         # children of the plan's nodes, BFS re-packed
        if grown is None: break                 # the source can draft nothing more
        pool, depths = grown, depths + 1
        plan = policy.after_depth(pool)
    keep = policy.select(pool)
    tree = check_selection(pool, keep, K, max_nodes)   # the policy's side: <= K, <= caps

``depths`` counts drafter calls (one per drafted depth); ``expansions`` counts the nodes (or
roots) the plans asked to expand. ``schedule_s`` / ``schedule_cpu_s`` are the wall and process
CPU time spent inside the policy's three methods (the scheduling overhead of a step). With
``around`` every policy call runs inside ``around()``, on the clock: a benchmark on a GPU passes a
context that synchronizes the device on exit (so the clock holds the device work the call
queued), or one that counts host syncs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from echo_core.tree import TreeBatch, empty_tree, select_nodes
from echo_scheduler.errors import PolicyError, TraceError
from echo_scheduler.interface import DraftPlan, Policy, StepBatch

Around = Callable[[], AbstractContextManager[object]]
"""A context factory every policy call runs inside (:func:`drive_step`'s ``around``)."""

MAX_DRAFT_DEPTH = 16
"""Default bound on drafted depths per step (every caller's default: engine, simulator)."""


class DraftSource(Protocol):
    """Where a step's draft candidates come from."""

    def grow(self, pool: TreeBatch, plan: DraftPlan) -> TreeBatch | None:
        """``pool`` with the children ``plan`` asks for appended (echo-scheduler's
        :func:`~echo_scheduler.pool.grow_pool` order), or None if nothing more can be drafted."""
        ...


@dataclass(frozen=True, slots=True)
class DrivenStep:
    """What one driven step produced."""

    pool: TreeBatch  # every candidate drafted this step
    keep: Tensor  # [pool.num_nodes] bool, the policy's selection
    tree: TreeBatch  # the selected SuperTree (select_nodes(pool, keep))
    depths: int  # drafter calls
    expansions: int  # nodes (or roots) expanded over all calls
    schedule_s: float  # wall time inside the policy's methods
    schedule_cpu_s: float  # process CPU time inside them (robust to a shared machine)


class PolicyClock:
    """Accumulates wall and CPU time of the calls it wraps."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self._t0 = self._c0 = 0.0

    def start(self) -> None:
        self._t0, self._c0 = time.perf_counter(), time.process_time()

    def stop(self) -> None:
        self.wall += time.perf_counter() - self._t0
        self.cpu += time.process_time() - self._c0

    @contextmanager
    def timed(self, around: Around | None) -> Iterator[None]:
        """The body on the clock, inside ``around()`` (if any)."""
        self.start()
        try:
            with around() if around is not None else nullcontext():
                yield
        finally:
            self.stop()


def drive_step(
    policy: Policy,
    source: DraftSource,
    batch: StepBatch,
    *,
    max_depth: int = MAX_DRAFT_DEPTH,
    strict: bool = False,
    around: Around | None = None,
) -> DrivenStep:
    """Run one step of ``policy`` over ``source`` (module docstring).

    ``max_depth`` bounds drafter calls; past it drafting stops, or with ``strict`` (the simulator)
    a :class:`PolicyError` says the policy never finished. Both contracts are checked on every
    plan and on the selection, so every caller makes and checks the same calls.
    """
    if max_depth < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    clock = PolicyClock()
    with clock.timed(around):
        plan = policy.begin_step(batch)
    pool = empty_tree(batch.batch_size, batch.max_nodes.device)
    depths = expansions = 0
    while not plan.done:
        if depths >= max_depth:
            if strict:
                raise PolicyError(f"{policy.name}: still drafting after {depths} depths")
            break
        check_plan(pool, plan, depths)
        grown = source.grow(pool, plan)
        if grown is None:
            break
        expansions += plan.expansions
        pool, depths = grown, depths + 1
        with clock.timed(around):
            plan = policy.after_depth(pool)
    with clock.timed(around):
        keep = policy.select(pool)
    tree = check_selection(pool, keep, batch.budget, batch.max_nodes)
    return DrivenStep(pool, keep, tree, depths, expansions, clock.wall, clock.cpu)


def check_selection(pool: TreeBatch, keep: Tensor, budget: int, max_nodes: Tensor) -> TreeBatch:
    """Raise unless ``keep`` is a legal selection (ancestor-closed, <= K, <= caps); return the
    SuperTree."""
    tree = select_nodes(pool, keep)  # raises TreeError unless ancestor-closed
    if tree.num_nodes > budget:
        raise PolicyError(f"selected {tree.num_nodes} nodes, budget is {budget}")
    over = tree.nodes_per_request() > max_nodes.to(tree.device)
    if bool(over.any()):
        raise PolicyError(f"requests {over.nonzero().flatten().tolist()} exceed max_nodes")
    return tree


def check_plan(pool: TreeBatch, plan: DraftPlan, depths: int) -> None:
    """Raise unless ``plan`` is legal after ``depths`` drafted depths: roots first (one entry per
    request), then distinct pool indices, all at the depth drafted last."""
    if plan.root_topk is not None:
        if depths != 0 or plan.root_topk.shape != (pool.batch_size,):
            raise TraceError("root_topk is legal on the first plan only, one entry per request")
        return
    e = plan.expand
    if depths == 0:
        raise TraceError("the first plan must draft the roots (root_topk)")
    if bool((e < 0).any() | (e >= pool.num_nodes).any()) or torch.unique(e).numel() != e.numel():
        raise TraceError(f"expand must hold distinct indices into the pool of {pool.num_nodes}")
    if bool((pool.depth[e] != depths).any()):
        raise TraceError(f"expanded nodes must sit at the depth drafted last ({depths})")
