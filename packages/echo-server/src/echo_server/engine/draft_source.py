"""The engine's draft source: a :class:`~echo_server.drafting.base.Drafter` behind the policy
driver (``echo_scheduler.driver.drive_step``).

The policy and the drafter never see each other: the policy answers which nodes to expand and
how wide (a :class:`DraftPlan`), :class:`DrafterSource` turns the plan into an
:class:`ExpandRequest` (request, request-local node, token path, top-k), asks the drafter for
children and appends them with echo-scheduler's ``grow_pool`` (the BFS order policies rely on).
"""

from __future__ import annotations

import torch

from echo_core.tree import ROOT, TreeBatch
from echo_scheduler.interface import DraftPlan
from echo_scheduler.pool import Children, grow_pool
from echo_server.drafting.base import Drafter, ExpandRequest


def _paths(pool: TreeBatch, nodes: torch.Tensor) -> list[list[int]]:
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


def expand_request(pool: TreeBatch, plan: DraftPlan) -> ExpandRequest:
    """What the drafter must expand for ``plan`` over ``pool``."""
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


class DrafterSource:
    """A drafter as the driver's draft source (``drafter.begin_step`` was called this step)."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter

    def grow(self, pool: TreeBatch, plan: DraftPlan) -> TreeBatch:
        request = expand_request(pool, plan)
        proposals = self.drafter.expand(request)
        dev = pool.device  # a host drafter's proposals cross to the pool's device once here
        src = proposals.source.to(dev)
        parent = torch.full_like(src, ROOT) if plan.root_topk is not None else plan.expand[src]
        children = Children(
            request=request.request[src],
            parent=parent,
            token=proposals.token.to(dev),
            draft_logprob=proposals.logprob.to(dev),
        )
        return grow_pool(pool, children)
