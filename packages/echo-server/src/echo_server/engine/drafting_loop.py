"""Step phase 1-2: draft depth by depth with the policy in control, then select the SuperTree.

The policy and the drafter never see each other: the policy answers which nodes to expand and
how wide (a :class:`DraftPlan`), the drafter proposes children for exactly those nodes, and this
loop appends them to the pool (echo-scheduler's ``grow_pool``, which keeps the BFS order the
policies rely on) until the policy is done; ``policy.select`` then picks the verified nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import ROOT, TreeBatch, empty_tree, select_nodes
from echo_scheduler.interface import DraftPlan, Policy, StepBatch
from echo_scheduler.pool import Children, grow_pool
from echo_server.drafting.base import Drafter, ExpandRequest


@dataclass(frozen=True, slots=True)
class DraftOutcome:
    """The step's full candidate pool, the selected SuperTree and how many depths were drafted."""

    pool: TreeBatch
    tree: TreeBatch
    keep: Tensor  # [pool.num_nodes] bool, the selection inside the pool
    depths: int


def _paths(pool: TreeBatch, nodes: Tensor) -> list[list[int]]:
    """Token path from the root (exclusive) to every node in ``nodes`` (global indices)."""
    gp = pool.global_parent().tolist()
    tokens = pool.token.tolist()
    out: list[list[int]] = []
    for g in nodes.tolist():
        path: list[int] = []
        while g >= 0:
            path.append(tokens[g])
            g = gp[g]
        path.reverse()
        out.append(path)
    return out


def _expand_request(pool: TreeBatch, plan: DraftPlan) -> ExpandRequest:
    if plan.root_topk is not None:
        req = (plan.root_topk > 0).nonzero().squeeze(1)
        return ExpandRequest(
            request=req,
            node=torch.full_like(req, ROOT),
            path=[[] for _ in range(req.numel())],
            topk=plan.root_topk[req],
        )
    req = pool.request_index()[plan.expand]
    return ExpandRequest(
        request=req,
        node=plan.expand - pool.cu_nodes[:-1][req],
        path=_paths(pool, plan.expand),
        topk=plan.topk,
    )


def draft_and_select(
    policy: Policy, drafter: Drafter, batch: StepBatch, max_depth: int = 64
) -> DraftOutcome:
    """Run the policy-drafter loop for one step (drafter.begin_step must have been called)."""
    pool = empty_tree(batch.batch_size)
    plan = policy.begin_step(batch)
    depths = 0
    while not plan.done and depths < max_depth:
        request = _expand_request(pool, plan)
        proposals = drafter.expand(request)
        src = proposals.source
        parent = torch.full_like(src, ROOT) if plan.root_topk is not None else plan.expand[src]
        pool = grow_pool(
            pool,
            Children(
                request=request.request[src],
                parent=parent,
                token=proposals.token,
                draft_logprob=proposals.logprob,
            ),
        )
        depths += 1
        plan = policy.after_depth(pool)
    keep = policy.select(pool)
    return DraftOutcome(pool=pool, tree=select_nodes(pool, keep), keep=keep, depths=depths)
