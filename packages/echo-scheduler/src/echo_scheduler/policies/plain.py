"""Policy 1, no speculation: never drafts, verifies only the root (plain decoding)."""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_scheduler.interface import BasePolicy, DraftPlan, StepBatch


class PlainPolicy(BasePolicy):
    """Every request decodes exactly one token per step."""

    name = "plain"

    def _first_plan(self, batch: StepBatch) -> DraftPlan:
        return DraftPlan.finished(batch.max_nodes.device)

    def _next_plan(self, pool: TreeBatch) -> DraftPlan:
        return DraftPlan.finished(pool.device)

    def select(self, pool: TreeBatch) -> Tensor:
        return torch.zeros(pool.num_nodes, dtype=torch.bool, device=pool.device)
