"""Which nodes to expand next: the EAGLE-2 frontier rule, batched over requests.

EAGLE-2 expansion: at depth d, every (active) request expands its ``k`` best depth-d nodes by
score, each into the drafter's top children. Computed for the whole batch with one sort.
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_scheduler.interface import DraftPlan
from echo_scheduler.ranking import top_per_request


def frontier(
    pool: TreeBatch,
    depth: int,
    k: int,
    active: Tensor,
    pos: Tensor,
    candidates: Tensor | None = None,
) -> Tensor:
    """Global indices ([M] int64, ascending) of every active request's ``k`` best depth-d nodes.

    ``active``: [B] bool; ``pos``: [N] int64 preference order (a permutation, lower is better,
    e.g. :func:`key_order`); ``candidates``: optional [N] bool restricting the choice further.
    """
    if pool.num_nodes == 0:
        return torch.zeros(0, dtype=torch.int64, device=pool.device)
    mask = (pool.depth == depth) & active[pool.request_index()]
    if candidates is not None:
        mask &= candidates
    ks = torch.full((pool.batch_size,), k, dtype=torch.int64, device=pool.device)
    return top_per_request(pool, pos, ks, mask).nonzero().squeeze(1)


def expand_all(nodes: Tensor, topk: int) -> DraftPlan:
    """A plan expanding every node of ``nodes`` ([M] int64) into ``topk`` children (none for
    ``topk < 1``); no host sync (:meth:`DraftPlan.nodes` filters per node, this need not)."""
    if topk < 1:
        return DraftPlan.finished(nodes.device)
    nodes = nodes.to(torch.int64)
    return DraftPlan(root_topk=None, expand=nodes, topk=torch.full_like(nodes, topk))
