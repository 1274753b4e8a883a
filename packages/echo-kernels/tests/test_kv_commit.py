"""KV commit: reference vs a Python loop (tier 1) and the Triton kernel vs reference (tier 2)."""

from __future__ import annotations

import pytest
import torch

from echo_core.acceptance import AcceptResult
from echo_core.random_trees import random_tree_batch
from echo_core.tree import TreeBatch, empty_tree, make_tree
from echo_kernels.acceptance import greedy_accept
from echo_kernels.backend import Backend
from echo_kernels.kv_commit import CommitResult, commit_kv, kept_rows

UNSET = -7


def loop_commit(
    table: list[list[int]], cache_len: list[int], row_slots: list[int], tree: TreeBatch,
    result: AcceptResult,
) -> tuple[list[list[int]], list[int], list[int]]:  # fmt: skip
    """The commit spelled out request by request: (table, new lengths, freed slots)."""
    table = [row[:] for row in table]
    kept: set[int] = set()
    lengths = []
    for b in range(tree.batch_size):
        root = int(tree.cu_nodes[b]) + b
        rows = [root] + [
            root + 1 + int(x) for x in result.accepted_nodes[b, : int(result.num_accepted[b])]
        ]
        for j, row in enumerate(rows):
            table[b][cache_len[b] + j] = row_slots[row]
        kept.update(rows)
        lengths.append(cache_len[b] + len(rows))
    free = [s for r, s in enumerate(row_slots) if r not in kept]
    return table, lengths, free


Step = tuple[TreeBatch, AcceptResult, torch.Tensor, torch.Tensor, torch.Tensor]
"""(tree, acceptance result, table [B, max_ctx], cache_len [B], row_slots [B+N])."""


def random_step(seed: int, batch: int = 6) -> Step:
    g = torch.Generator().manual_seed(seed)
    tree = random_tree_batch(g, batch_size=batch, max_nodes=8, vocab=2)
    r = tree.batch_size + tree.num_nodes
    result = greedy_accept(tree, torch.randint(0, 2, (r,), generator=g), backend="torch")
    cache_len = torch.randint(0, 5, (batch,), generator=g)
    table = torch.full((batch, 16), UNSET, dtype=torch.int64)
    row_slots = torch.randperm(200, generator=g)[:r]
    return tree, result, table, cache_len, row_slots


def pool_rows(seed: int, batch: int, rows: int) -> torch.Tensor:
    """``batch`` distinct rows of a ``rows``-row pool table, in no particular order."""
    return torch.randperm(rows, generator=torch.Generator().manual_seed(seed))[:batch]


def run(
    backend: Backend, device: torch.device, tree: TreeBatch, result: AcceptResult,
    table: torch.Tensor, cache_len: torch.Tensor, row_slots: torch.Tensor,
    req_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, CommitResult]:  # fmt: skip
    t = table.clone().to(device)
    out = commit_kv(
        t, cache_len.to(device), row_slots.to(device), tree.to(device),
        result.accepted_nodes.to(device), result.num_accepted.to(device),
        req_rows=None if req_rows is None else req_rows.to(device), backend=backend,
    )  # fmt: skip
    return t.cpu(), out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_matches_python_loop(seed: int) -> None:
    tree, result, table, cache_len, row_slots = random_step(seed)
    new_table, out = run("torch", torch.device("cpu"), tree, result, table, cache_len, row_slots)
    want_table, want_len, want_free = loop_commit(
        table.tolist(), cache_len.tolist(), row_slots.tolist(), tree, result
    )
    assert new_table.tolist() == want_table
    assert out.cache_len.tolist() == want_len
    assert out.free_slots.tolist() == want_free


def test_docstring_worked_example() -> None:
    tree = make_tree([[(1, -1, -0.1), (2, -1, -0.1), (3, 0, -0.1)]])
    result = AcceptResult(torch.tensor([[0, 2]]), torch.tensor([2]), torch.tensor([9]))
    table = torch.full((1, 8), UNSET, dtype=torch.int64)
    out = commit_kv(
        table, torch.tensor([3]), torch.tensor([40, 41, 42, 43]), tree,
        result.accepted_nodes, result.num_accepted,
    )  # fmt: skip
    assert table[0, 3:6].tolist() == [40, 41, 43]
    assert table[0, 6].item() == UNSET
    assert out.cache_len.tolist() == [6]
    assert out.free_slots.tolist() == [42]


@pytest.mark.parametrize("seed", [0, 3])
def test_kernel_matches_reference(kernel_device: torch.device, seed: int) -> None:
    step = random_step(seed)
    t_table, t_out = run("triton", kernel_device, *step)
    r_table, r_out = run("torch", torch.device("cpu"), *step)
    assert torch.equal(t_table, r_table)
    assert torch.equal(t_out.cache_len.cpu(), r_out.cache_len)
    assert torch.equal(t_out.free_slots.cpu(), r_out.free_slots)


@pytest.mark.parametrize("seed", [1, 2])
def test_kernel_matches_reference_on_pool_rows(kernel_device: torch.device, seed: int) -> None:
    tree, result, _, cache_len, row_slots = random_step(seed)
    pool = torch.full((9, 16), UNSET, dtype=torch.int64)
    step = (tree, result, pool, cache_len, row_slots, pool_rows(seed, tree.batch_size, 9))
    t_table, t_out = run("triton", kernel_device, *step)
    r_table, r_out = run("torch", torch.device("cpu"), *step)
    assert torch.equal(t_table, r_table)
    assert torch.equal(t_out.cache_len.cpu(), r_out.cache_len)
    assert torch.equal(t_out.free_slots.cpu(), r_out.free_slots)


@pytest.mark.parametrize("case", ["all-accepted", "all-rejected", "zero-node", "empty-batch"])
def test_kernel_edge_batches(kernel_device: torch.device, case: str) -> None:
    chain = [(1, -1, -0.1), (1, 0, -0.1), (1, 1, -0.1)]
    tree = {
        "all-accepted": make_tree([chain, chain[:1]]),
        "all-rejected": make_tree([chain, chain[:2]]),
        "zero-node": empty_tree(3),
        "empty-batch": empty_tree(0),
    }[case]
    b, r = tree.batch_size, tree.batch_size + tree.num_nodes
    argmax = torch.full((r,), 1 if case == "all-accepted" else 0, dtype=torch.int64)
    result = greedy_accept(tree, argmax, backend="torch")
    table = torch.full((b, 9), UNSET, dtype=torch.int64)
    step = (tree, result, table, torch.full((b,), 2, dtype=torch.int64), torch.arange(r) + 100)
    t_table, t_out = run("triton", kernel_device, *step)
    r_table, r_out = run("torch", torch.device("cpu"), *step)
    assert torch.equal(t_table, r_table)
    assert torch.equal(t_out.free_slots.cpu(), r_out.free_slots)
    kept = r_out.cache_len - 2
    if case == "all-accepted":
        assert kept.tolist() == [4, 2]
        assert r_out.free_slots.numel() == 0
    elif case != "empty-batch":
        assert kept.tolist() == [1] * b  # the root only
        assert r_out.free_slots.numel() == tree.num_nodes


def test_rejects_overflow_and_foreign_nodes() -> None:
    tree, result, table, cache_len, row_slots = random_step(4)
    nodes, num = result.accepted_nodes, result.num_accepted
    with pytest.raises(ValueError, match="overflows req_to_slot"):
        commit_kv(table[:, :2], cache_len, row_slots, tree, nodes, num)
    if int(num.sum()):
        with pytest.raises(ValueError, match="accepted_nodes out of range"):
            commit_kv(table, cache_len, row_slots, tree, torch.full_like(nodes, 50), num)
    with pytest.raises(ValueError, match="row_slots must be"):
        commit_kv(table, cache_len, row_slots[:-1], tree, nodes, num)
    b = tree.batch_size
    wide = torch.full((b + 2, 16), UNSET, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"req_to_slot must be \[B=6, max_ctx\] without req_rows"):
        commit_kv(wide, cache_len, row_slots, tree, nodes, num)
    with pytest.raises(ValueError, match="req_rows must be distinct"):
        commit_kv(wide, cache_len, row_slots, tree, nodes, num, req_rows=torch.zeros(b).long())
    with pytest.raises(ValueError, match="req_rows out of"):
        commit_kv(wide, cache_len, row_slots, tree, nodes, num, req_rows=torch.arange(b) + 3)


@pytest.mark.parametrize("seed", [0, 5])
def test_reference_writes_the_rows_named_by_req_rows(seed: int) -> None:
    tree, result, table, cache_len, row_slots = random_step(seed)
    b = tree.batch_size
    rows = pool_rows(seed, b, 11)
    pool = torch.full((11, 16), UNSET, dtype=torch.int64)
    new_pool, out = run(
        "torch", torch.device("cpu"), tree, result, pool, cache_len, row_slots, rows
    )
    batch_table, want = run("torch", torch.device("cpu"), tree, result, table, cache_len, row_slots)
    assert torch.equal(new_pool[rows], batch_table)
    others = torch.ones(11, dtype=torch.bool)
    others[rows] = False
    assert bool((new_pool[others] == UNSET).all())  # rows of requests outside the batch
    assert torch.equal(out.cache_len, want.cache_len)
    assert torch.equal(out.free_slots, want.free_slots)


def test_kept_rows_complement_the_freed_slots() -> None:
    tree, result, table, cache_len, row_slots = random_step(6)
    keep = kept_rows(tree, result.accepted_nodes, result.num_accepted)
    _, out = run("torch", torch.device("cpu"), tree, result, table, cache_len, row_slots)
    assert torch.equal(out.free_slots, row_slots[~keep])
    assert int(keep.sum()) == tree.batch_size + int(result.num_accepted.sum())
