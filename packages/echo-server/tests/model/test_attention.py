"""Attention backends vs a brute-force per-row reference (random pool, ragged batches, trees).

float32 backends vs the float64 reference: within :func:`rounding_atol` (float32, reduction
``max(head dim, longest context)`` = 8-12, |out| < ~2.5): 1.6e-6 to 4.5e-6, observed 0.7e-7 to
2.4e-7.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from echo_core.tolerance import float_tolerance
from echo_core.tree import make_tree
from echo_core.verify_rows import verify_offsets
from echo_server.model.attention import (
    AttentionBackend,
    AttentionBatch,
    make_batch,
    ragged_positions,
    tree_row_mask,
)
from echo_server.model.kernels_attention import KernelsAttention
from echo_server.model.kv_mirror import MirrorConfig
from echo_server.model.torch_attention import DensePlan, GroupedPlan, TorchAttention, split_roots

HEADS, KV_HEADS, DIM, SLOTS = 4, 2, 8, 64
SCALE = DIM**-0.5


def brute_force(
    batch: AttentionBatch, q: Tensor, k_pool: Tensor, v_pool: Tensor, scale: float
) -> Tensor:
    """Row by row in float64: keys = cached prefix + visible new rows (module contract)."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = HEADS // KV_HEADS
    for b in range(batch.batch_size):
        lo, n = int(batch.cu_rows[b]), batch.rows_host[b]
        cached = batch.slot_table[int(batch.req_rows[b]), : batch.cache_len_host[b]].tolist()
        for r in range(n):
            if batch.new_mask is None:
                visible = list(range(r + 1))
            else:
                visible = [j for j in range(n) if bool(batch.new_mask[lo + r, j])]
            slots = cached + [int(batch.write_slots[lo + j]) for j in visible]
            k, v = k_pool[slots].double(), v_pool[slots].double()  # [C, Hkv, D]
            for h in range(HEADS):
                w = torch.softmax(k[:, h // group] @ q[lo + r, h].double() * scale, 0)
                out[lo + r, h] = w @ v[:, h // group]
    return out


def rounding_atol(batch: AttentionBatch, expected: Tensor) -> float:
    """float32 rounding of attention over ``batch`` around ``expected`` (module docstring)."""
    reduction = max(DIM, batch.max_context)
    return float_tolerance(torch.float32, reduction, scale=float(expected.abs().max()))


def random_batch(
    cache_lens: list[int], rows: list[int], new_mask: Tensor | None = None, seed: int = 0
) -> tuple[AttentionBatch, Tensor, Tensor, Tensor]:
    """A pool with random K/V, each request's prefix on scattered slots, new rows written."""
    gen = torch.Generator().manual_seed(seed)
    k_pool = torch.randn(SLOTS, KV_HEADS, DIM, generator=gen)
    v_pool = torch.randn(SLOTS, KV_HEADS, DIM, generator=gen)
    perm = torch.randperm(SLOTS - 1, generator=gen) + 1  # slot 0 is the null slot
    table = torch.zeros(len(rows) + 2, 32, dtype=torch.int64)
    req_rows = [len(rows) + 1 - b for b in range(len(rows))]  # not the identity on purpose
    used = 0
    for b, c in enumerate(cache_lens):
        table[req_rows[b], :c] = perm[used : used + c]
        used += c
    write = perm[used : used + sum(rows)].clone()
    batch = make_batch(table, req_rows, cache_lens, rows, write, new_mask)
    q = torch.randn(sum(rows), HEADS, DIM, generator=gen)
    return batch, q, k_pool, v_pool


def run(
    backend: AttentionBackend[Any], batch: AttentionBatch, q: Tensor, kp: Tensor, vp: Tensor
) -> Tensor:
    plan = backend.plan(batch)
    k_new, v_new = kp[batch.write_slots], vp[batch.write_slots]
    return backend.attend(plan, q, k_new, v_new, kp, vp, SCALE)


BACKENDS: list[AttentionBackend[Any]] = [
    TorchAttention(),
    TorchAttention(group_rows=False),
    TorchAttention(mirror=MirrorConfig(1, KV_HEADS * DIM * 4, min_context=0)),
    KernelsAttention(backend="torch"),
]
BACKEND_IDS = ["torch", "torch_dense", "torch_mirror", "echo_kernels"]
CASES = {
    "decode_equal_context": ([5, 5, 5], [1, 1, 1]),
    "decode_ragged_context": ([3, 9, 0], [1, 1, 1]),
    "prefill_ragged": ([0, 0, 0], [4, 1, 7]),
    "chunked_prefill": ([6, 2], [3, 5]),
    "zero_row_request": ([4, 7, 2], [2, 0, 3]),
    "single": ([11], [1]),
}


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
@pytest.mark.parametrize("case", list(CASES))
def test_causal_rows_match_brute_force(backend: AttentionBackend[Any], case: str) -> None:
    cache_lens, rows = CASES[case]
    batch, q, kp, vp = random_batch(cache_lens, rows)
    got = run(backend, batch, q, kp, vp)
    want = brute_force(batch, q, kp, vp, SCALE)
    torch.testing.assert_close(got.double(), want, atol=rounding_atol(batch, want), rtol=0)


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_tree_rows_match_brute_force(backend: AttentionBackend[Any]) -> None:
    tree = make_tree(
        [
            [(5, -1, -0.1), (6, -1, -0.2), (7, 0, -0.3), (8, 2, -0.1), (9, 1, -0.5)],
            [],
            [(1, -1, -0.1), (2, 0, -0.1)],
        ]
    )
    rows = (verify_offsets(tree)[1:] - verify_offsets(tree)[:-1]).tolist()
    batch, q, kp, vp = random_batch([4, 6, 0], rows, tree_row_mask(tree), seed=3)
    got = run(backend, batch, q, kp, vp)
    want = brute_force(batch, q, kp, vp, SCALE)
    torch.testing.assert_close(got.double(), want, atol=rounding_atol(batch, want), rtol=0)


def test_roots_are_planned_apart_from_trees_when_that_halves_the_padding() -> None:
    """Rows [1, 5, 0, 1, 1]: dense pads 5 x 5 = 25 query rows, split 3 + 5 = 8 < 12.5; the
    empty request is in no group; each packed row in exactly one group, request-major."""
    batch, *_ = random_batch([4, 7, 2, 0, 5], [1, 5, 0, 1, 1])
    plan = TorchAttention().plan(batch)
    assert isinstance(plan, GroupedPlan)
    assert [(p.batch_size, p.max_rows) for p in plan.plans] == [(3, 1), (1, 5)]
    assert [r.tolist() for r in plan.rows] == [[0, 6, 7], [1, 2, 3, 4, 5]]
    assert plan.num_rows == 8
    assert isinstance(TorchAttention(group_rows=False).plan(batch), DensePlan)
    assert split_roots((1, 1, 3, 3)) is None  # 2 + 6 = 8 of 12: not under half
    assert split_roots((1, 1, 1, 1, 1, 1, 3, 3)) is None  # 12 of 24
    assert split_roots((1, 1, 1, 1, 1, 1, 1, 5)) == [[0, 1, 2, 3, 4, 5, 6], [7]]  # 12 of 40
    assert split_roots((3, 3, 3)) is None  # one kind only
    assert split_roots((1, 1)) is None
    assert split_roots((4, 1, 0, 1, 2, 1)) == [[1, 3, 5], [0, 4]]  # 3 + 8 = 11 of 24
    assert split_roots((4, 1, 0, 2)) is None  # 1 + 8 = 9 of 16


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_roots_beside_a_tree_match_brute_force(backend: AttentionBackend[Any]) -> None:
    tree = make_tree([[], [(5, -1, -0.1), (6, -1, -0.2), (7, 0, -0.3), (8, 2, -0.1)], [], []])
    rows = (verify_offsets(tree)[1:] - verify_offsets(tree)[:-1]).tolist()
    assert rows == [1, 5, 1, 1]
    batch, q, kp, vp = random_batch([4, 6, 0, 9], rows, tree_row_mask(tree), seed=5)
    got = run(backend, batch, q, kp, vp)
    want = brute_force(batch, q, kp, vp, SCALE)
    torch.testing.assert_close(got.double(), want, atol=rounding_atol(batch, want), rtol=0)


def test_tree_row_mask_worked_example() -> None:
    tree = make_tree([[(5, -1, -0.1), (6, 0, -0.1)], [(7, -1, -0.1)]])
    expected = [[1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert tree_row_mask(tree).int().tolist() == expected


def test_ragged_positions_continue_each_cache() -> None:
    batch, *_ = random_batch([3, 0, 5], [2, 3, 1])
    assert ragged_positions(batch).tolist() == [3, 4, 0, 1, 2, 5]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rows": [1, 2], "cache_lens": [0]}, "differ in length"),
        ({"rows": [40], "cache_lens": [0]}, "slot table width"),
        ({"rows": [-1], "cache_lens": [0]}, ">= 0"),
    ],
)
def test_make_batch_rejects_bad_input(kwargs: dict[str, list[int]], message: str) -> None:
    table = torch.zeros(2, 32, dtype=torch.int64)
    rows, cache = kwargs["rows"], kwargs["cache_lens"]
    write = torch.zeros(max(sum(rows), 0), dtype=torch.int64)
    with pytest.raises(ValueError, match=message):
        make_batch(table, [0] * len(cache), cache, rows, write)


def test_dense_plan_builds_its_additive_mask_once_and_it_equals_the_boolean_one() -> None:
    """The SDPA mask is made on the first layer's call and reused: 0 where the boolean mask is
    true, -inf elsewhere, each row block repeated per query head of a KV head; attending with
    it gives exactly what SDPA gives for the boolean mask (it converts booleans the same way)."""
    tree = make_tree([[(5, -1, -0.1), (6, 0, -0.2)], [], [(1, -1, -0.1)]])
    rows = (verify_offsets(tree)[1:] - verify_offsets(tree)[:-1]).tolist()
    batch, q, kp, vp = random_batch([4, 6, 2], rows, tree_row_mask(tree), seed=7)
    plan = TorchAttention(group_rows=False).plan(batch)
    assert isinstance(plan, DensePlan)
    assert plan.mask is not None
    group = HEADS // KV_HEADS
    first = plan.sdpa_mask(group, torch.float32)
    assert first is plan.sdpa_mask(group, torch.float32)  # cached, not rebuilt per layer
    assert first is not None
    assert first.shape == (3, 1, group * plan.max_rows, plan.mask.shape[-1])
    keep = plan.mask.repeat(1, 1, group, 1)
    assert bool((first[keep] == 0).all())
    assert bool(torch.isneginf(first[~keep]).all())
    got = TorchAttention(group_rows=False).attend(plan, q, q, q, kp, vp, SCALE)
    b, w, dim = plan.batch_size, plan.max_rows, q.shape[2]
    assert plan.row_req is not None
    assert plan.row_local is not None
    q_dense = q.new_zeros(b, w, HEADS, dim)
    q_dense[plan.row_req, plan.row_local] = q
    q_grouped = q_dense.view(b, w, KV_HEADS, group, dim).permute(0, 2, 3, 1, 4)
    c = plan.kv_index.shape[1]
    k = kp[plan.kv_index.reshape(-1)].view(b, c, KV_HEADS, dim).transpose(1, 2)
    v = vp[plan.kv_index.reshape(-1)].view(b, c, KV_HEADS, dim).transpose(1, 2)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q_grouped.reshape(b, KV_HEADS, group * w, dim), k, v, attn_mask=keep, scale=SCALE
    )
    ref = ref.view(b, KV_HEADS, group, w, dim).permute(0, 3, 1, 2, 4).reshape(b, w, HEADS, dim)
    assert torch.equal(got, ref[plan.row_req, plan.row_local])
