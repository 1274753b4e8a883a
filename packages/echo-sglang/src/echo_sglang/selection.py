"""Driving an echo-scheduler policy over a pool that a fixed drafter (SGLang's EAGLE) drafted.

SGLang's EAGLE worker drafts its pool in one go; the policy interface is incremental (begin_step,
after_depth per drafted depth, select). :class:`PoolReplay` replays the drafting depth by depth
over the finished pool through echo-scheduler's policy driver (``drive_step``, the same loop the
engine and the simulator run), so gates fire at their checkpoints exactly as in the engine. Its
draft source grows a *view* of the pool:

1. the first plan's view holds the root children of rank < ``root_topk[b]``;
2. every later plan grows the view by the children of the nodes it expands with rank < the
   plan's top-k, if EAGLE drafted them (it expands only its own top-k frontier, so a plan can
   ask for children that do not exist: they are simply absent); when none exist, drafting ends;
3. the driver's selection on the last view is mapped back to the pool.

Views keep the pool's node order (a subset of it, parents first), so request-local indices of
existing nodes never change between calls, as the interface requires.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import SuperTree, TreeBatch, select_nodes
from echo_scheduler.driver import drive_step
from echo_scheduler.interface import DraftPlan, Policy, StepBatch


@dataclass(frozen=True, slots=True)
class Selection:
    """The SuperTree a policy chose, and where its nodes sit in the pool."""

    tree: SuperTree
    pool_index: Tensor  # [n] int64, global pool index of every selected node, in tree order
    drafted: Tensor  # [N_pool] bool, the nodes the policy drafted (its last view, which its
    # gates saw): ``select_nodes(pool, drafted)`` rebuilds it when needed (feedback only)


class _PoolViews:
    """The replay's draft source: each ``grow`` returns the next view of a drafted pool."""

    def __init__(self, pool: TreeBatch, rank: Tensor) -> None:
        self.pool, self.rank = pool, rank
        self.req, self.gp = pool.request_index(), pool.global_parent()
        self.drafted = torch.zeros(pool.num_nodes, dtype=torch.bool, device=pool.device)
        self.index = torch.zeros(0, dtype=torch.int64, device=pool.device)  # view -> pool node
        self.depth = 0

    def grow(self, view: TreeBatch, plan: DraftPlan) -> TreeBatch | None:
        pool, dev = self.pool, self.pool.device
        if plan.root_topk is not None:
            if pool.num_nodes == 0:
                return None
            grown = (pool.depth == 1) & (self.rank < plan.root_topk.to(dev)[self.req])
        else:
            allowed = torch.zeros(pool.num_nodes, dtype=torch.int64, device=dev)
            allowed[self.index[plan.expand.to(dev)]] = plan.topk.to(dev)
            grown = (pool.depth == self.depth + 1) & (self.gp >= 0)
            grown &= self.rank < allowed[self.gp.clamp(min=0)]
            if not bool(grown.any()):
                return None
        self.drafted |= grown
        self.index = self.drafted.nonzero().squeeze(1)
        self.depth += 1
        return select_nodes(pool, self.drafted)


class PoolReplay:
    """One policy, driven once per decode step over a drafted pool (module docstring)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def select(
        self,
        pool: TreeBatch,  # every drafted node, parents first, depth-sorted per request
        rank: Tensor,  # [N] int64, child rank under the parent (0 = best)
        batch: StepBatch,
    ) -> Selection:
        if pool.batch_size != batch.batch_size:
            raise ValueError(
                f"pool has {pool.batch_size} requests but the step has {batch.batch_size}"
            )
        if rank.shape != (pool.num_nodes,) or rank.dtype != torch.int64:
            raise ValueError(
                f"rank must be [N={pool.num_nodes}] int64, got {tuple(rank.shape)} {rank.dtype}"
            )
        views = _PoolViews(pool, rank)
        driven = drive_step(self.policy, views, batch)
        chosen = torch.zeros(pool.num_nodes, dtype=torch.bool, device=pool.device)
        chosen[views.index[driven.keep.to(pool.device)]] = True
        return Selection(
            select_nodes(pool, chosen),
            chosen.nonzero().squeeze(1),
            views.drafted,
        )
