"""Tier 2: the Triton tree-attention kernel against the torch reference.

Runs under the Triton interpreter on CPU (TRITON_INTERPRET=1, tests/conftest.py) and compiled
on a GPU when one is present. Shapes are small but odd (not powers of two) and cover empty
trees, zero-node requests, single-token prefixes, multi-block prefixes and prefill.
"""

from __future__ import annotations

import pytest
import torch

from echo_core.random_trees import random_tree_batch
from echo_core.tree import TreeBatch, empty_tree, make_tree
from echo_kernels.attention_metadata import (
    TreeAttentionMetadata,
    prefill_metadata,
    verify_metadata,
)
from echo_kernels.testing import KVPool, QueryRows, random_pool, random_rows
from echo_kernels.tolerances import ATTENTION_TOLERANCES
from echo_kernels.tree_attention import tree_attention, tree_attention_triton


def check(
    rows: QueryRows, pool: KVPool, meta: TreeAttentionMetadata, window: int | None = None
) -> None:
    args = (rows.q, rows.k_new, rows.v_new, pool.k_pool, pool.v_pool, meta)
    got = tree_attention(*args, window=window, backend="triton")
    want = tree_attention(*args, window=window, backend="torch")
    tol = ATTENTION_TOLERANCES[rows.q.dtype]
    assert got.dtype == rows.q.dtype
    assert got.shape == rows.q.shape
    torch.testing.assert_close(got.float(), want.float(), atol=tol.atol, rtol=tol.rtol)


def verify_case(
    tree: TreeBatch, cache_len: list[int], heads: tuple[int, int], head_dim: int,
    dtype: torch.dtype, device: torch.device, seed: int = 0,
) -> tuple[QueryRows, KVPool, TreeAttentionMetadata]:  # fmt: skip
    g = torch.Generator(device).manual_seed(seed)
    tree = tree.to(device)
    r = tree.batch_size + tree.num_nodes
    pool = random_pool(g, cache_len, r, heads[1], head_dim, dtype)
    rows = random_rows(g, r, heads[0], heads[1], head_dim, dtype)
    return rows, pool, verify_metadata(tree, pool.cache_len, pool.req_to_slot)


# (name, heads (Hq, Hkv), head dim, dtype, cache lengths, window)
SCENARIOS = [
    ("gqa3-odd-dim-fp32", (6, 2), 24, torch.float32, [0, 1, 37, 70, 5], None),
    ("gqa3-window-fp32", (6, 2), 24, torch.float32, [0, 1, 37, 70, 5], 4),
    ("mha-fp16", (4, 4), 32, torch.float16, [3, 130, 1, 9, 0], None),
    ("smollm2-geometry-fp16", (9, 3), 64, torch.float16, [66, 2, 1, 0, 17], 50),
    ("bf16-upcast", (8, 2), 16, torch.bfloat16, [5, 0, 64, 1, 3], None),
]


@pytest.mark.parametrize(
    ("heads", "head_dim", "dtype", "cache_len", "window"),
    [s[1:] for s in SCENARIOS],
    ids=[s[0] for s in SCENARIOS],
)
def test_kernel_matches_reference_on_random_trees(
    kernel_device: torch.device, heads: tuple[int, int], head_dim: int, dtype: torch.dtype,
    cache_len: list[int], window: int | None,
) -> None:  # fmt: skip
    tree = random_tree_batch(torch.Generator().manual_seed(7), batch_size=5, max_nodes=9)
    check(*verify_case(tree, cache_len, heads, head_dim, dtype, kernel_device), window=window)


def test_wide_tree_spans_several_row_blocks_and_mask_words(kernel_device: torch.device) -> None:
    # 37 nodes + root: two mask words, and 38 rows x 2 heads = 76 > BLOCK_M = 64.
    nodes = [(i % 5, (i - 1) // 2, -0.1) for i in range(37)]  # a binary heap shape
    tree = make_tree([nodes, [(1, -1, -0.5)]])
    check(*verify_case(tree, [21, 1], (4, 2), 16, torch.float32, kernel_device))


def test_decode_only_batch_of_zero_node_requests(kernel_device: torch.device) -> None:
    check(*verify_case(empty_tree(3), [1, 1, 40], (6, 3), 32, torch.float16, kernel_device))


def test_single_token_prefixes(kernel_device: torch.device) -> None:
    tree = random_tree_batch(torch.Generator().manual_seed(8), batch_size=3, max_nodes=4)
    check(*verify_case(tree, [1, 1, 1], (2, 1), 16, torch.float32, kernel_device), window=2)


def test_empty_batch_launches_nothing(kernel_device: torch.device) -> None:
    rows, pool, meta = verify_case(empty_tree(0), [], (2, 1), 16, torch.float32, kernel_device)
    out = tree_attention_triton(
        rows.q, rows.k_new, rows.v_new, pool.k_pool, pool.v_pool, meta, scale=0.25
    )
    assert out.shape == (0, 2, 16)


@pytest.mark.parametrize("window", [None, 9])
def test_causal_prefill(kernel_device: torch.device, window: int | None) -> None:
    g = torch.Generator(kernel_device).manual_seed(9)
    counts, cached = [23, 1, 0, 40], [0, 3, 5, 66]
    pool = random_pool(g, cached, sum(counts), 3, 32, torch.float16)
    rows = random_rows(g, sum(counts), 9, 3, 32, torch.float16)
    meta = prefill_metadata(torch.tensor(counts, device=kernel_device), pool.cache_len,
                            pool.req_to_slot)  # fmt: skip
    check(rows, pool, meta, window)


def test_mixed_batch_of_tree_and_causal_requests(kernel_device: torch.device) -> None:
    # Request 0 verifies a tree; request 1 prefills 45 tokens, more than its mask words hold.
    tree = make_tree([[(1, -1, -0.1), (2, -1, -0.1), (3, 1, -0.1)]])
    g = torch.Generator(kernel_device).manual_seed(10)
    pool = random_pool(g, [6, 2], 4 + 45, 2, 16)
    rows = random_rows(g, 4 + 45, 4, 2, 16)
    dev = kernel_device
    part = verify_metadata(tree.to(dev), pool.cache_len[:1], pool.req_to_slot[:1])
    words = part.tree_bits.shape[1]
    meta = TreeAttentionMetadata(
        cu_rows=torch.tensor([0, 4, 49], device=dev),
        positions=torch.cat([part.positions, 2 + torch.arange(45, device=dev)]),
        cache_len=pool.cache_len,
        req_to_slot=pool.req_to_slot,
        tree_bits=torch.cat(
            [part.tree_bits, torch.zeros(45, words, dtype=torch.int32, device=dev)]
        ),
        causal=torch.tensor([False, True], device=dev),
        max_rows=45,
    )
    meta.validate()
    check(rows, pool, meta, window=None)


def test_launcher_rejects_bad_inputs(kernel_device: torch.device) -> None:
    tree = make_tree([[(1, -1, -0.1)]])
    rows, pool, meta = verify_case(tree, [2], (4, 2), 16, torch.float32, kernel_device)
    base = (rows.q, rows.k_new, rows.v_new, pool.k_pool, pool.v_pool, meta)
    with pytest.raises(ValueError, match="q must be contiguous"):
        tree_attention_triton(rows.q.transpose(1, 2).contiguous().transpose(1, 2), *base[1:], 1.0)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        tree_attention_triton(rows.q[:, :3].contiguous(), *base[1:], 1.0)
    k16 = pool.k_pool.half()
    with pytest.raises(ValueError, match=r"k_pool is torch\.float16"):
        tree_attention_triton(*base[:3], k16, pool.v_pool, meta, 1.0)
    with pytest.raises(ValueError, match="window must be None or >= 1"):
        tree_attention_triton(*base, 1.0, window=0)
    with pytest.raises(ValueError, match="metadata describes 2 rows"):
        tree_attention_triton(rows.q[:1], rows.k_new[:1], rows.v_new[:1], *base[3:], 1.0)


def test_large_grids_take_four_warps_and_narrow_key_tiles_for_wide_m() -> None:
    from echo_kernels.tree_attention import LARGE_GRID, AttentionConfig, attention_config

    bf16 = torch.bfloat16
    # small grid: unchanged (8 warps at head dim 128)
    assert attention_config(bf16, 128, 4, 8, programs=128) == AttentionConfig(32, 64, 128, 8)
    assert attention_config(bf16, 128, 4, 8, programs=LARGE_GRID) == AttentionConfig(32, 64, 128, 4)
    assert attention_config(bf16, 128, 4, 16, programs=2048) == AttentionConfig(64, 32, 128, 4)
    # float32 keeps its own tiles (the measurement was bf16)
    assert attention_config(torch.float32, 128, 4, 8, programs=2048).num_warps == 8
