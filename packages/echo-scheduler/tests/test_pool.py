"""Growing a pool by one drafted depth keeps BFS order and request-local indices."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_core.tree import ROOT, empty_tree
from echo_scheduler.errors import TraceError
from echo_scheduler.pool import Children, grow_pool, older_index

FAST = settings(max_examples=40, deadline=None)


def _children(request: list[int], parent: list[int], seed: int) -> Children:
    g = torch.Generator().manual_seed(seed)
    n = len(request)
    return Children(
        request=torch.tensor(request, dtype=torch.int64),
        parent=torch.tensor(parent, dtype=torch.int64),
        token=torch.randint(0, 50, (n,), generator=g),
        draft_logprob=-torch.rand(n, generator=g),
    )


@FAST
@given(counts=st.lists(st.integers(0, 3), min_size=1, max_size=5), seed=st.integers(0, 999))
def test_grown_pool_is_valid_bfs_and_keeps_old_local_indices(counts: list[int], seed: int) -> None:
    batch = len(counts)
    req = [b for b, c in enumerate(counts) for _ in range(c)]
    pool = grow_pool(empty_tree(batch), _children(req, [ROOT] * len(req), seed))
    pool.validate()
    # expand every depth-1 node in reverse order with 2 children each
    nodes = list(range(pool.num_nodes))[::-1]
    parents = [i for i in nodes for _ in range(2)]
    reqs = [int(pool.request_index()[i]) for i in parents]
    grown = grow_pool(pool, _children(reqs, parents, seed + 1))
    grown.validate()
    for b in range(batch):
        old, new = pool.request(b), grown.request(b)
        assert torch.equal(new.token[: old.num_nodes], old.token)
        assert bool((new.depth[1:] >= new.depth[:-1]).all())  # depth-sorted (BFS)
        assert bool((new.parent[old.num_nodes :][1:] >= new.parent[old.num_nodes :][:-1]).all())
    at = older_index(grown, pool)  # every old node where the grown pool has it, no sync
    assert torch.equal(grown.token[at], pool.token)
    assert torch.equal(grown.path_logprob[at], pool.path_logprob)
    assert torch.equal(grown.request_index()[at], pool.request_index())
    assert int((grown.depth == 2).sum()) == grown.num_nodes - pool.num_nodes  # the rest is new


def test_children_of_one_node_keep_the_drafters_rank_order() -> None:
    pool = grow_pool(empty_tree(1), _children([0, 0], [ROOT, ROOT], 0))
    kids = Children(
        request=torch.tensor([0, 0, 0]),
        parent=torch.tensor([1, 1, 0]),
        token=torch.tensor([7, 8, 9]),
        draft_logprob=torch.tensor([-0.1, -0.2, -0.3]),
    )
    grown = grow_pool(pool, kids)
    assert grown.token[2:].tolist() == [9, 7, 8]
    assert grown.parent[2:].tolist() == [0, 1, 1]


def test_children_must_belong_to_their_parents_request() -> None:
    pool = grow_pool(empty_tree(2), _children([0, 1], [ROOT, ROOT], 0))
    with pytest.raises(TraceError, match="request"):
        grow_pool(pool, _children([1], [0], 1))
    with pytest.raises(TraceError, match="index the pool"):
        grow_pool(pool, _children([0], [5], 1))
