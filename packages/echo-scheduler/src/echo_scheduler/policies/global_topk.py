"""Policy 5, batch-global top-K by path score without gating (TETRIS extended to trees).

Drafting: EAGLE-2 expansion (each request's ``k0`` best nodes per depth by path score, each into
``draft_width`` children) down to ``max_depth`` for every request allowed to draft. Selection: the
K nodes of highest path score ``P_i = exp(path_logprob_i)`` across the whole batch, at most
``max_nodes[b]`` per request. ``P`` never increases from parent to child, so the top-K set is
ancestor-closed (ties broken by index, parents first).
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_scheduler.config import PolicyConfig
from echo_scheduler.interface import BasePolicy, DraftPlan, StepBatch
from echo_scheduler.policies.frontier import expand_all, frontier
from echo_scheduler.ranking import budgeted_select, key_order, path_score


class GlobalTopKPolicy(BasePolicy):
    """One shared budget, ranked by raw path score, no gates."""

    name = "global_topk"

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config

    def _first_plan(self, batch: StepBatch) -> DraftPlan:
        return DraftPlan.roots(torch.where(batch.max_nodes > 0, self.config.draft_width, 0))

    def _next_plan(self, pool: TreeBatch) -> DraftPlan:
        if self.depth >= self.config.max_depth:
            return DraftPlan.finished(pool.device)
        active = self.batch.max_nodes > 0
        nodes = frontier(pool, self.depth, self.config.topk, active, key_order(path_score(pool)))
        return expand_all(nodes, self.config.draft_width)

    def select(self, pool: TreeBatch) -> Tensor:
        every = torch.ones(pool.num_nodes, dtype=torch.bool, device=pool.device)
        pos = key_order(path_score(pool))
        return budgeted_select(pool, pos, every, self.batch.max_nodes, self.batch.budget)
