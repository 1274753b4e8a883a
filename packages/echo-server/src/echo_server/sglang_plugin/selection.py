"""Driving an echo-scheduler policy over a pool that a fixed drafter (SGLang's EAGLE) drafted.

SGLang's EAGLE worker drafts its pool in one go; the policy interface is incremental (begin_step,
after_depth per drafted depth, select). :class:`PoolReplay` replays the drafting depth by depth
over the finished pool, so gates fire at their checkpoints exactly as in the engine:

1. ``plan = begin_step(batch)``; the view holds the root children of rank < ``root_topk[b]``;
2. after each depth: ``plan = after_depth(view)``; the view grows by the children of the nodes the
   plan expands with rank < the plan's top-k, if EAGLE drafted them (it expands only its own
   top-k frontier, so a plan can ask for children that do not exist: they are simply absent);
3. ``keep = select(view)`` on the last view, mapped back to the pool.

Views keep the pool's node order (a subset of it, parents first), so request-local indices of
existing nodes never change between calls, as the interface requires.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import SuperTree, TreeBatch, empty_tree, select_nodes
from echo_scheduler.interface import Policy, StepBatch


@dataclass(frozen=True, slots=True)
class Selection:
    """The SuperTree a policy chose, and where its nodes sit in the pool."""

    tree: SuperTree
    pool_index: Tensor  # [n] int64, global pool index of every selected node, in tree order


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
        dev = pool.device
        nothing = Selection(
            empty_tree(pool.batch_size, dev), torch.zeros(0, dtype=torch.int64, device=dev)
        )
        plan = self.policy.begin_step(batch)
        if plan.done or plan.root_topk is None or pool.num_nodes == 0:
            return nothing
        req = pool.request_index()
        gp = pool.global_parent()
        drafted = (pool.depth == 1) & (rank < plan.root_topk.to(dev)[req])
        depth = 1
        while True:
            index = drafted.nonzero().squeeze(1)  # view node -> pool node
            view = select_nodes(pool, drafted)
            plan = self.policy.after_depth(view)
            if plan.done:
                break
            allowed = torch.zeros(pool.num_nodes, dtype=torch.int64, device=dev)
            allowed[index[plan.expand.to(dev)]] = plan.topk.to(dev)
            grown = (pool.depth == depth + 1) & (gp >= 0)
            grown &= rank < allowed[gp.clamp(min=0)]
            if not bool(grown.any()):
                break
            drafted |= grown
            depth += 1
        keep = self.policy.select(view).to(dev)
        chosen = torch.zeros(pool.num_nodes, dtype=torch.bool, device=dev)
        chosen[index[keep]] = True
        return Selection(select_nodes(pool, chosen), chosen.nonzero().squeeze(1))
