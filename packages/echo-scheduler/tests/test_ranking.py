"""Selection primitives against brute force on random pools."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_core.random_trees import random_tree_batch
from echo_core.tree import TreeBatch, make_tree, select_nodes
from echo_scheduler.ranking import (
    budgeted_select,
    first_in_order,
    key_order,
    monotone_key,
    path_score,
    rank_in_group,
    top_per_request,
)

FAST = settings(max_examples=40, deadline=None)
THOROUGH = settings(max_examples=400, deadline=None)


def _pool(seed: int, batch: int, nodes: int) -> TreeBatch:
    return random_tree_batch(torch.Generator().manual_seed(seed), batch, nodes, max_depth=5)


def _greedy(
    pool: TreeBatch, pos: list[int], eligible: list[bool], cap: list[int], k: int
) -> set[int]:
    """Reference: repeatedly take the best-positioned node that is available right now."""
    gp = pool.global_parent().tolist()
    req = pool.request_index().tolist()
    taken: set[int] = set()
    count = [0] * pool.batch_size
    while len(taken) < k:
        ready = [
            i
            for i in range(pool.num_nodes)
            if i not in taken
            and eligible[i]
            and (gp[i] < 0 or gp[i] in taken)
            and count[req[i]] < cap[req[i]]
        ]
        if not ready:
            break
        best = min(ready, key=lambda i: pos[i])
        taken.add(best)
        count[req[best]] += 1
    return taken


@THOROUGH
@given(
    seed=st.integers(0, 10_000),
    batch=st.integers(0, 5),
    nodes=st.integers(0, 12),
    budget=st.integers(0, 30),
    data=st.data(),
)
def test_budgeted_select_matches_best_available_greedy(
    seed: int, batch: int, nodes: int, budget: int, data: st.DataObject
) -> None:
    pool = _pool(seed, batch, nodes)
    n = pool.num_nodes
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1))
    eligible = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    cap = data.draw(st.lists(st.integers(0, 6), min_size=batch, max_size=batch))
    keep = budgeted_select(
        pool, perm, torch.tensor(eligible, dtype=torch.bool), torch.tensor(cap), budget
    )
    expected = _greedy(pool, perm.tolist(), eligible, cap, budget)
    assert set(keep.nonzero().flatten().tolist()) == expected
    select_nodes(pool, keep).validate()


def test_budgeted_select_follows_the_greedy_past_a_tied_path_maximum() -> None:
    # a (pos 20) -> b (12), c (14), d (3); b -> e (9): the path maximum ties a, b, c, d, e at 20,
    # the greedy takes a, d, b, e (e's 9 beats c's 14)
    pool = make_tree([[(1, -1, -0.1), (2, 0, -0.1), (3, 0, -0.1), (4, 0, -0.1), (5, 1, -0.1)]])
    pos = torch.tensor([4, 2, 3, 0, 1])  # a strict priority with the same relative order
    keep = budgeted_select(pool, pos, torch.ones(5, dtype=torch.bool), torch.tensor([10]), budget=4)
    assert keep.tolist() == [True, True, False, True, True]


@FAST
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 5), budget=st.integers(0, 25))
def test_budgeted_select_is_nested_in_the_budget(seed: int, batch: int, budget: int) -> None:
    pool = _pool(seed, batch, 10)
    pos = key_order(torch.rand(pool.num_nodes, generator=torch.Generator().manual_seed(seed)))
    every = torch.ones(pool.num_nodes, dtype=torch.bool)
    caps = torch.full((batch,), 4)
    small = budgeted_select(pool, pos, every, caps, budget)
    large = budgeted_select(pool, pos, every, caps, budget + 1)
    assert bool((small <= large).all())
    assert int(large.sum()) - int(small.sum()) in (0, 1)


@FAST
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 5), k=st.integers(0, 6))
def test_top_by_path_score_per_request_is_ancestor_closed(seed: int, batch: int, k: int) -> None:
    pool = _pool(seed, batch, 12)
    keep = top_per_request(pool, key_order(path_score(pool)), torch.full((batch,), k))
    select_nodes(pool, keep).validate()
    assert bool((select_nodes(pool, keep).nodes_per_request() <= k).all())


@FAST
@given(seed=st.integers(0, 10_000))
def test_monotone_key_never_rises_along_a_path(seed: int) -> None:
    pool = _pool(seed, 4, 12)
    raw = torch.rand(pool.num_nodes, generator=torch.Generator().manual_seed(seed))
    key = monotone_key(pool, raw)
    gp = pool.global_parent()
    has = gp >= 0
    assert bool((key[has] <= key[gp[has]]).all())
    assert bool((key <= raw).all())


def test_key_order_breaks_ties_by_tiebreak_then_index() -> None:
    key = torch.tensor([0.5, 0.9, 0.5, 0.5])
    tiebreak = torch.tensor([0.1, 0.0, 0.3, 0.1])
    assert key_order(key, tiebreak).tolist() == [2, 0, 1, 3]
    assert key_order(key).tolist() == [1, 0, 2, 3]


def test_rank_in_group_ranks_by_position_within_each_group() -> None:
    group = torch.tensor([1, 0, 1, 1, 0])
    pos = torch.tensor([4, 3, 0, 2, 1])
    mask = torch.tensor([True, True, True, False, True])
    assert rank_in_group(group, pos, mask).tolist()[:3] == [1, 1, 0]
    assert rank_in_group(group, pos, mask)[4] == 0


def test_deferred_node_waits_for_its_parent() -> None:
    pool = make_tree([[(1, -1, -1.0), (2, 0, -0.1)]])
    keep = budgeted_select(
        pool, torch.tensor([1, 0]), torch.ones(2, dtype=torch.bool), torch.tensor([5]), 1
    )
    assert keep.tolist() == [True, False]


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    m=st.integers(0, 40),
    groups=st.integers(1, 5),
    budget=st.integers(0, 30),
)
def test_first_in_order_takes_what_the_sequential_rule_takes(
    seed: int, m: int, groups: int, budget: int
) -> None:
    """Walk ``pos`` order, take an element (of the mask, if any) while its group is under its cap
    and the total under the budget: the reference for ``first_in_order``."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.randperm(m, generator=g)
    group = torch.randint(0, groups, (m,), generator=g)
    cap = torch.randint(0, 6, (groups,), generator=g)
    mask = torch.rand(m, generator=g) < 0.7
    for masked in (None, mask):
        want = torch.zeros(m, dtype=torch.bool)
        held = [0] * groups
        for i in torch.argsort(pos).tolist():
            b = int(group[i])
            if (masked is None or masked[i]) and held[b] < int(cap[b]) and sum(held) < budget:
                held[b] += 1
                want[i] = True
        assert torch.equal(first_in_order(pos, group, cap, budget, masked), want)
