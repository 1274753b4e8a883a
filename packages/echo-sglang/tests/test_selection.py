"""Policies driven over an EAGLE pool: EAGLE-2 reproduces SGLang's choice, ECHO keeps its budget."""

from __future__ import annotations

import pytest
import torch

from echo_gating.policy import GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.interface import StepBatch
from echo_scheduler.policies import make_policy
from echo_sglang.eagle_pool import EaglePool, concat_draft_lists, pool_from_eagle
from echo_sglang.selection import PoolReplay, Selection
from echo_sglang.synthetic import eagle2_selection, eagle_draft


def _draft(seed: int, b: int, steps: int, topk: int) -> tuple[EaglePool, torch.Tensor]:
    lists = eagle_draft(torch.Generator().manual_seed(seed), b, steps, topk)
    scores, tokens, parents = concat_draft_lists(*lists)
    return pool_from_eagle(scores, tokens, parents, topk), scores


def _run(
    pool: EaglePool, name: str, config: PolicyConfig, budget: int, cap: int,
    gate: GatePolicy | None = None,
) -> Selection:  # fmt: skip
    b = pool.tree.batch_size
    batch = StepBatch(b, budget, torch.full((b,), cap, dtype=torch.int64))
    return PoolReplay(make_policy(name, config, gate)).select(pool.tree, pool.rank, batch)


@pytest.mark.parametrize(("steps", "topk", "n"), [(2, 2, 5), (3, 3, 8), (4, 4, 16), (5, 2, 9)])
def test_eagle2_policy_reproduces_sglang_eagle2_choice(steps: int, topk: int, n: int) -> None:
    b = 4
    pool, scores = _draft(steps * 100 + n, b, steps, topk)
    config = PolicyConfig(base_depth=steps, topk=topk, num_draft_tokens=n, max_depth=steps)
    chosen = _run(pool, "eagle2", config, budget=b * (n - 1), cap=n - 1)
    chosen.tree.validate()
    ours = pool.flat_index[chosen.pool_index].view(b, n - 1).sort(dim=1).values
    assert torch.equal(ours, eagle2_selection(scores, n))


@pytest.mark.parametrize("budget", [0, 1, 7, 20, 64])
def test_echo_selection_respects_budget_caps_and_ancestry(budget: int) -> None:
    b, steps, topk, n = 5, 4, 3, 9
    pool, _ = _draft(budget, b, steps, topk)
    config = PolicyConfig(base_depth=steps, topk=topk, num_draft_tokens=n, max_depth=steps)
    chosen = _run(pool, "echo", config, budget=budget, cap=n - 1)
    tree = chosen.tree
    tree.validate()  # ancestor-closed and well formed
    assert tree.num_nodes == min(budget, b * (n - 1))
    assert bool((tree.nodes_per_request() <= n - 1).all())
    assert torch.equal(tree.token, pool.tree.token[chosen.pool_index])


def test_echo_spends_an_uneven_budget_unevenly() -> None:
    b, steps, topk, n = 6, 5, 4, 17
    pool, _ = _draft(3, b, steps, topk)
    config = PolicyConfig(base_depth=3, topk=topk, num_draft_tokens=n, max_depth=steps)
    sizes = _run(pool, "echo", config, budget=30, cap=n - 1).tree.nodes_per_request()
    assert int(sizes.sum()) == 30
    assert int(sizes.max()) > int(sizes.min())  # elastic: no fixed per-request share


def test_a_failed_gate_truncates_every_request_at_its_checkpoint() -> None:
    b, steps, topk, n = 3, 4, 3, 13
    pool, _ = _draft(5, b, steps, topk)
    config = PolicyConfig(base_depth=steps, topk=topk, num_draft_tokens=n, max_depth=steps)
    never = GatePolicy.fixed(1.0, max_depth=steps)  # layer confidence is < 1: always fails
    chosen = _run(pool, "echo_fixed", config, budget=b * (n - 1), cap=n - 1, gate=never)
    assert int(chosen.tree.max_depth()) == 1
    assert chosen.tree.nodes_per_request().tolist() == [topk] * b  # width, not depth


def test_chain_policy_follows_the_best_drafted_path() -> None:
    b, steps, topk = 3, 4, 3
    pool, _ = _draft(9, b, steps, topk)
    config = PolicyConfig(base_depth=steps, topk=topk, max_depth=steps, chain_length=steps)
    chain = _run(pool, "chain", config, budget=b * steps, cap=steps).tree
    assert chain.nodes_per_request().tolist() == [steps] * b
    assert chain.depth.view(b, steps).tolist() == [list(range(1, steps + 1))] * b
    assert bool((pool.rank[_run(pool, "chain", config, b * steps, steps).pool_index] == 0).all())


def test_rank_must_match_the_pool() -> None:
    pool, _ = _draft(1, 2, 2, 2)
    batch = StepBatch.uniform(2, 4)
    with pytest.raises(ValueError, match="rank must be"):
        PoolReplay(make_policy("echo")).select(pool.tree, pool.rank[:-1], batch)
