"""Tier 1: the torch reference of tree attention against an explicit per-row softmax loop.

The float32 reference vs the float64 loop: within :func:`rounding_atol` (float32, reduction
``max(head dim, longest context)`` = 8-16, |out| < ~3.2): 3.1e-6 to 6.2e-6, observed 0 to 4e-7.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from echo_core.random_trees import random_tree_batch
from echo_core.tolerance import float_tolerance
from echo_core.tree import ROOT, TreeBatch, make_tree
from echo_kernels.attention_metadata import (
    TreeAttentionMetadata,
    prefill_metadata,
    verify_metadata,
)
from echo_kernels.testing import KVPool, QueryRows, random_pool, random_rows
from echo_kernels.tolerances import ATTENTION_TOLERANCES
from echo_kernels.tree_attention import tree_attention

HQ, HKV, D = 6, 2, 8


def tree_visibility(tree: TreeBatch, b: int) -> list[set[int]]:
    """Per local verify row of request b (0 = root), the local rows it sees, by parent walks."""
    parents = tree.request(b).parent.tolist()
    visible = [{0}]
    for i in range(len(parents)):
        seen, cur = {0}, i
        while cur != ROOT:
            seen.add(cur + 1)
            cur = parents[cur]
        visible.append(seen)
    return visible


def brute_force(
    rows: QueryRows,
    pool: KVPool,
    cu_rows: list[int],
    visibility: list[list[set[int]]],  # per request, per local row: visible local rows
    positions: list[int],  # per packed row
    window: int | None,
) -> Tensor:  # [R, HQ, D] float64
    out = torch.zeros(rows.q.shape, dtype=torch.float64)
    group = HQ // HKV
    for b, visible in enumerate(visibility):
        cached = int(pool.cache_len[b])
        for i, cols in enumerate(visible):
            r = cu_rows[b] + i
            keys: list[tuple[Tensor, Tensor, int]] = []  # (k [HKV, D], v, position)
            for j in range(cached):
                slot = int(pool.req_to_slot[b, j])
                keys.append((pool.k_pool[slot], pool.v_pool[slot], j))
            for c in sorted(cols):
                rc = cu_rows[b] + c
                keys.append((rows.k_new[rc], rows.v_new[rc], positions[rc]))
            for h in range(HQ):
                q = rows.q[r, h].double()
                logits = []
                for k, _, pos in keys:
                    if window is None or positions[r] - pos < window:
                        logits.append(float(q @ k[h // group].double()) / math.sqrt(D))
                    else:
                        logits.append(-math.inf)
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights)
                for w, (_, v, _) in zip(weights, keys, strict=True):
                    out[r, h] += w / total * v[h // group].double()
    return out


def rounding_atol(meta: TreeAttentionMetadata, cache_len: Tensor, expected: Tensor) -> float:
    """float32 rounding of attention over ``meta``'s rows around ``expected`` (module docstring)."""
    rows = meta.cu_rows[1:] - meta.cu_rows[:-1]
    context = int((cache_len + rows).max())
    return float_tolerance(torch.float32, max(D, context), scale=float(expected.abs().max()))


def run_reference(
    rows: QueryRows, pool: KVPool, meta: TreeAttentionMetadata, window: int | None
) -> Tensor:
    return tree_attention(
        rows.q, rows.k_new, rows.v_new, pool.k_pool, pool.v_pool, meta,
        window=window, backend="torch",
    )  # fmt: skip


@pytest.mark.parametrize("window", [None, 1, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_reference_matches_brute_force_on_random_trees(seed: int, window: int | None) -> None:
    g = torch.Generator().manual_seed(seed)
    tree = random_tree_batch(g, batch_size=4, max_nodes=6)
    pool = random_pool(g, [0, 1, 5, 9], tree.num_nodes + 4, HKV, D)
    rows = random_rows(g, tree.num_nodes + 4, HQ, HKV, D)
    meta = verify_metadata(tree, pool.cache_len, pool.req_to_slot)
    visibility = [tree_visibility(tree, b) for b in range(4)]
    expected = brute_force(
        rows, pool, meta.cu_rows.tolist(), visibility, meta.positions.tolist(), window
    )
    got = run_reference(rows, pool, meta, window)
    atol = rounding_atol(meta, pool.cache_len, expected)
    torch.testing.assert_close(got.double(), expected, atol=atol, rtol=0)


def test_reference_matches_brute_force_on_causal_prefill() -> None:
    g = torch.Generator().manual_seed(2)
    counts, cached = [3, 0, 5], [2, 4, 0]
    pool = random_pool(g, cached, sum(counts), HKV, D)
    rows = random_rows(g, sum(counts), HQ, HKV, D)
    meta = prefill_metadata(torch.tensor(counts), pool.cache_len, pool.req_to_slot)
    visibility = [[set(range(i + 1)) for i in range(n)] for n in counts]
    expected = brute_force(rows, pool, [0, 3, 3, 8], visibility, meta.positions.tolist(), 4)
    atol = rounding_atol(meta, pool.cache_len, expected)
    got = run_reference(rows, pool, meta, 4).double()
    torch.testing.assert_close(got, expected, atol=atol, rtol=0)


def test_chain_tree_verify_equals_causal_prefill() -> None:
    g = torch.Generator().manual_seed(3)
    tree = make_tree([[(1, -1, -0.1), (2, 0, -0.1), (3, 1, -0.1)], [], [(4, -1, -0.2)]])
    pool = random_pool(g, [4, 2, 7], tree.num_nodes + 3, HKV, D)
    rows = random_rows(g, tree.num_nodes + 3, HQ, HKV, D)
    as_tree = verify_metadata(tree, pool.cache_len, pool.req_to_slot)
    as_chain = prefill_metadata(torch.tensor([4, 1, 2]), pool.cache_len, pool.req_to_slot)
    assert torch.equal(as_tree.positions, as_chain.positions)
    for window in (None, 2):
        torch.testing.assert_close(
            run_reference(rows, pool, as_tree, window), run_reference(rows, pool, as_chain, window)
        )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_keeps_dtype_and_accumulates_in_float32(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(4)
    tree = random_tree_batch(g, batch_size=3, max_nodes=5)
    pool32 = random_pool(g, [3, 0, 6], tree.num_nodes + 3, HKV, D)
    rows32 = random_rows(g, tree.num_nodes + 3, HQ, HKV, D)
    meta = verify_metadata(tree, pool32.cache_len, pool32.req_to_slot)
    rows, pool = rows32.to(dtype), pool32.to(dtype)  # rounded once: both sides see the same
    got = run_reference(rows, pool, meta, None)
    assert got.dtype == dtype
    exact = run_reference(rows.to(torch.float32), pool.to(torch.float32), meta, None)
    tol = ATTENTION_TOLERANCES[dtype]
    torch.testing.assert_close(got.float(), exact, atol=tol.atol, rtol=tol.rtol)


def test_zero_node_requests_cost_one_row_each() -> None:
    g = torch.Generator().manual_seed(5)
    tree = make_tree([[], [], []])
    pool = random_pool(g, [1, 1, 1], 3, HKV, D)
    rows = random_rows(g, 3, HQ, HKV, D)
    meta = verify_metadata(tree, pool.cache_len, pool.req_to_slot)
    assert meta.max_rows == 1
    assert meta.num_rows == 3
    visibility = [[{0}] for _ in range(3)]
    expected = brute_force(rows, pool, [0, 1, 2, 3], visibility, meta.positions.tolist(), None)
    atol = rounding_atol(meta, pool.cache_len, expected)
    got = run_reference(rows, pool, meta, None).double()
    torch.testing.assert_close(got, expected, atol=atol, rtol=0)
