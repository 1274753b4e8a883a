"""The policy driver: the one draft-and-select loop, its bounds and its contract checks."""

from __future__ import annotations

import pytest
import torch

from echo_core.tree import TreeBatch
from echo_scheduler.config import PolicyConfig
from echo_scheduler.driver import MAX_DRAFT_DEPTH, drive_step
from echo_scheduler.errors import PolicyError, TraceError
from echo_scheduler.interface import BasePolicy, DraftPlan, StepBatch
from echo_scheduler.policies import make_policy
from echo_scheduler.pool import grow_pool
from echo_scheduler.simulator import SimSource
from echo_scheduler.workloads import SyntheticStep, SyntheticWorkload


def _step(seed: int, batch: int) -> SyntheticStep:
    return SyntheticWorkload.llama().sample(batch, 1, torch.Generator().manual_seed(seed))[0]


class _Endless(BasePolicy):
    """Drafts one child of every leaf forever; selects nothing."""

    name = "endless"

    def _first_plan(self, batch: StepBatch) -> DraftPlan:
        return DraftPlan.roots(torch.ones(batch.batch_size, dtype=torch.int64))

    def _next_plan(self, pool: TreeBatch) -> DraftPlan:
        leaves = (pool.depth == self.depth).nonzero().squeeze(1)
        return DraftPlan.nodes(leaves, torch.ones_like(leaves))

    def select(self, pool: TreeBatch) -> torch.Tensor:
        return torch.zeros(pool.num_nodes, dtype=torch.bool)


class _Stops:
    """A source that drafts ``depths`` depths, then has nothing more (like a finished pool)."""

    def __init__(self, step: SyntheticStep, depths: int) -> None:
        self.step, self.left, self.calls = step, depths, 0

    def grow(self, pool: TreeBatch, plan: DraftPlan) -> TreeBatch | None:
        self.calls += 1
        if self.left == 0:
            return None
        self.left -= 1
        return grow_pool(pool, self.step.draft(pool, plan))


def test_the_depth_bound_stops_drafting_or_is_an_error_when_strict() -> None:
    step = _step(0, 3)
    batch = StepBatch.uniform(3, 12)
    run = drive_step(_Endless(), SimSource(step), batch, max_depth=4)
    assert run.depths == 4
    assert run.pool.max_depth() == 4
    assert run.expansions == 4 * 3
    with pytest.raises(PolicyError, match="still drafting after 16 depths"):
        drive_step(_Endless(), SimSource(step), batch, strict=True)
    assert MAX_DRAFT_DEPTH == 16


def test_a_source_with_nothing_more_ends_the_step_and_the_policy_still_selects() -> None:
    step = _step(1, 4)
    source = _Stops(step, depths=2)
    run = drive_step(
        make_policy("chain", PolicyConfig(max_depth=6)), source, StepBatch.uniform(4, 40)
    )
    assert source.calls == 3  # the third call found nothing
    assert run.depths == 2
    assert run.tree.num_nodes == int(run.keep.sum()) > 0
    assert run.tree.max_depth() <= 2


def test_an_illegal_plan_is_refused_before_the_source_sees_it() -> None:
    class _Twice(_Endless):
        def _next_plan(self, pool: TreeBatch) -> DraftPlan:
            node = torch.zeros(2, dtype=torch.int64)  # the same node twice
            return DraftPlan(root_topk=None, expand=node, topk=torch.ones(2, dtype=torch.int64))

    source = _Stops(_step(2, 2), depths=10)
    with pytest.raises(TraceError, match="distinct"):
        drive_step(_Twice(), source, StepBatch.uniform(2, 8))
    assert source.calls == 1  # only the roots were drafted


def test_an_over_budget_selection_is_refused() -> None:
    class _Greedy(_Endless):
        def select(self, pool: TreeBatch) -> torch.Tensor:
            return torch.ones(pool.num_nodes, dtype=torch.bool)

    with pytest.raises(PolicyError, match="budget is 5"):
        drive_step(_Greedy(), SimSource(_step(3, 3)), StepBatch.uniform(3, 5), max_depth=3)
