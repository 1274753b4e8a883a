"""Fixed-size baselines: chain, static tree and the EAGLE-2 tree with one size for everyone.

These model what serving systems ship today (SGLang: one draft-token count for the whole batch,
so that CUDA graphs see fixed shapes). Under a budget K they shrink uniformly: every request gets
``n_b = min(n, floor(K / B), max_nodes[b])`` draft nodes, so ``sum n_b <= K``; the remainder of K
stays unused, which is exactly the inefficiency a shared budget removes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_scheduler.config import PolicyConfig
from echo_scheduler.interface import BasePolicy, DraftPlan, StepBatch
from echo_scheduler.policies.frontier import expand_all, frontier
from echo_scheduler.ranking import budgeted_select, key_order, path_score


def uniform_caps(batch: StepBatch, n: int) -> Tensor:
    """``n_b = min(n, K // B, max_nodes[b])``: [B] int64."""
    share = batch.budget // max(batch.batch_size, 1)
    return batch.max_nodes.clamp(max=min(n, share))


class _UniformPolicy(BasePolicy):
    """Shared select: per request the first ``n_b`` nodes in ``_order`` (ancestor-closed)."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config
        self.caps = torch.zeros(0, dtype=torch.int64)

    def _size(self) -> int:
        raise NotImplementedError

    def _start(self, batch: StepBatch) -> None:
        self.caps = uniform_caps(batch, self._size())

    def _first_plan(self, batch: StepBatch) -> DraftPlan:
        return DraftPlan.roots(torch.where(self.caps > 0, self._root_children(), 0))

    def _root_children(self) -> int:
        raise NotImplementedError

    def _order(self, pool: TreeBatch) -> Tensor:
        """Position of every node in this policy's preference order: [N] int64 permutation."""
        return torch.arange(pool.num_nodes, device=pool.device)

    def _still_short(self, pool: TreeBatch) -> Tensor:
        """[B] bool: requests holding fewer drafted nodes than their size."""
        return pool.nodes_per_request() < self.caps

    def select(self, pool: TreeBatch) -> Tensor:
        every = torch.ones(pool.num_nodes, dtype=torch.bool, device=pool.device)
        return budgeted_select(pool, self._order(pool), every, self.caps, self.batch.budget)


class ChainPolicy(_UniformPolicy):
    """Policy 2, classic speculative decoding: a greedy top-1 chain of ``chain_length`` tokens."""

    name = "chain"

    def _size(self) -> int:
        return self.config.chain_length

    def _root_children(self) -> int:
        return 1

    def _next_plan(self, pool: TreeBatch) -> DraftPlan:
        more = self._still_short(pool)
        return expand_all(frontier(pool, self.depth, 1, more, key_order(path_score(pool))), 1)


class StaticTreePolicy(_UniformPolicy):
    """Policy 3, a fixed shape (EAGLE-1/Medusa style): every depth-d node gets ``branching[d]``
    children; trimmed to ``n_b`` nodes in breadth-first (pool) order, which is ancestor-closed.
    """

    name = "static"

    def _size(self) -> int:
        size, width = 0, 1
        for b in self.config.static_branching:
            width *= b
            size += width
        return size

    def _root_children(self) -> int:
        return self.config.static_branching[0]

    def _next_plan(self, pool: TreeBatch) -> DraftPlan:
        branching = self.config.static_branching
        if self.depth >= len(branching):
            return DraftPlan.finished(pool.device)
        more = self._still_short(pool)
        nodes = ((pool.depth == self.depth) & more[pool.request_index()]).nonzero().squeeze(1)
        return expand_all(nodes, branching[self.depth])


class Eagle2Policy(_UniformPolicy):
    """Policy 4, EAGLE-2 as SGLang ships it: expand the top-k frontier by path score for
    ``base_depth`` depths, rerank every drafted node by path score, keep the best ``n_b`` per
    request (the same size for every request).
    """

    name = "eagle2"

    def _size(self) -> int:
        return self.config.tree_nodes

    def _root_children(self) -> int:
        return self.config.topk

    def _next_plan(self, pool: TreeBatch) -> DraftPlan:
        if self.depth >= self.config.base_depth:
            return DraftPlan.finished(pool.device)
        k = self.config.topk
        best = key_order(path_score(pool))
        return expand_all(frontier(pool, self.depth, k, self.caps > 0, best), k)

    def _order(self, pool: TreeBatch) -> Tensor:
        return key_order(path_score(pool))
