"""KV-slot bookkeeping ops against SGLang's Triton twins, and a plain reference where none."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from sgl_kernel.spec_cache import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
)

from .conftest import Twins

JUNK = 7_777
"""Written into outputs before a call: an element a kernel leaves alone keeps it."""


def _pow2(n: int) -> int:
    """The smallest power of two >= n (>= 1), SGLang's ``next_power_of_2``."""
    return 1 << max(n - 1, 0).bit_length()


def _table(gen: torch.Generator, rows: int, pool_len: int) -> Tensor:
    """A req_to_token table [rows, pool_len] int32 of random KV slots."""
    return torch.randint(0, 1 << 20, (rows, pool_len), generator=gen, dtype=torch.int32)


@pytest.mark.parametrize(
    ("batch", "topk", "steps"), [(1, 1, 1), (3, 1, 5), (4, 2, 3), (2, 8, 20), (7, 4, 4)]
)
def test_draft_cache_locs_match_sglang_triton(
    twins: Twins, batch: int, topk: int, steps: int
) -> None:
    gen = torch.Generator().manual_seed(batch * 100 + topk * 10 + steps)
    width = topk * steps
    pool_len = 40 + width
    table = _table(gen, 9, pool_len)
    rows = torch.randperm(9, generator=gen)[:batch]
    seq_lens = torch.randint(0, pool_len - width + 1, (batch,), generator=gen)
    outs = torch.full((2, batch * width), JUNK, dtype=torch.int64)
    assign_draft_cache_locs_contiguous_cpu(rows, table, seq_lens, outs[0], pool_len, topk, steps)
    twins.draft_cache_locs(rows, table, seq_lens, outs[1], topk, steps)
    assert outs[0].tolist() == outs[1].tolist()


def _spans(gen: torch.Generator, batch: int, pool_len: int, longest: int) -> tuple[Tensor, Tensor]:
    """Random ``[start, end)`` column ranges inside a row, empty ones included."""
    length = torch.randint(0, longest + 1, (batch,), generator=gen)
    start = (torch.rand((batch,), generator=gen) * (pool_len - length + 1)).long()
    return start, start + length


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize(("batch", "longest", "seed"), [(1, 5, 0), (3, 40, 1), (6, 70, 2)])
def test_extend_cache_locs_match_sglang_triton(
    twins: Twins, batch: int, longest: int, seed: int, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(seed)
    pool_len = 80
    table = _table(gen, 8, pool_len)
    rows = torch.randperm(8, generator=gen)[:batch]
    start, end = (x.to(dtype) for x in _spans(gen, batch, pool_len, longest))
    outs = torch.full((2, int((end - start).sum()) + 3), JUNK, dtype=torch.int64)
    assign_extend_cache_locs_cpu(rows, table, start, end, outs[0], pool_len)
    twins.extend_cache_locs[(batch,)](rows, table, start, end, outs[1], pool_len, _pow2(batch))
    assert outs[0].tolist() == outs[1].tolist()


@pytest.mark.parametrize(("batch", "longest", "seed"), [(1, 3, 0), (4, 40, 1), (7, 66, 2)])
def test_req_to_token_pool_matches_sglang_triton(
    twins: Twins, batch: int, longest: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    pool_len = 90
    tables = _table(gen, 10, pool_len).expand(2, -1, -1).clone()
    rows = torch.randperm(10, generator=gen)[:batch].int()
    start, end = (x.int() for x in _spans(gen, batch, pool_len, longest))
    slots = torch.randint(0, 1 << 20, (int((end - start).sum()),), generator=gen)
    assign_req_to_token_pool_cpu(rows, tables[0], start, end, slots, pool_len)
    twins.req_to_token_pool[(batch,)](rows, tables[1], start, end, slots, pool_len, _pow2(batch))
    assert tables[0].tolist() == tables[1].tolist()


def test_req_to_token_pool_inverts_extend_cache_locs() -> None:
    gen = torch.Generator().manual_seed(3)
    table = _table(gen, 5, 30)
    rows = torch.tensor([4, 0, 2])
    start, end = torch.tensor([3, 0, 10]), torch.tensor([9, 0, 30])
    packed = torch.empty((26,), dtype=torch.int64)
    assign_extend_cache_locs_cpu(rows, table, start, end, packed, 30)
    rewritten = torch.zeros_like(table)
    assign_req_to_token_pool_cpu(rows, rewritten, start, end, packed, 30)
    for r, s, e in zip(rows.tolist(), start.tolist(), end.tolist(), strict=True):
        assert rewritten[r, s:e].tolist() == table[r, s:e].tolist()


def _accept_index(gen: torch.Generator, batch: int, t: int, width: int, full: bool) -> Tensor:
    """verify's accept_index [B, width] int32: the root slot, accepted slots, then -1."""
    out = torch.full((batch, width), -1, dtype=torch.int32)
    for b in range(batch):
        n = width if full else int(torch.randint(1, width + 1, (1,), generator=gen))
        nodes = torch.randperm(t - 1, generator=gen)[: n - 1].sort().values + 1
        out[b, :n] = torch.cat((torch.zeros(1, dtype=torch.int64), nodes)).int() + b * t
    return out


@pytest.mark.parametrize(
    ("batch", "t", "width", "full"), [(1, 2, 2, False), (1, 5, 4, True), (4, 8, 4, False)]
)
def test_accept_out_cache_loc_matches_sglang_triton(
    twins: Twins, batch: int, t: int, width: int, full: bool
) -> None:
    gen = torch.Generator().manual_seed(batch * 10 + t)
    accept_index = _accept_index(gen, batch, t, width, full)
    out_cache_loc = torch.randint(0, 1 << 20, (batch * t,), generator=gen)
    outs = torch.full((3, batch * width), JUNK, dtype=torch.int64)
    fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, outs[0])  # SGLang's CPU call
    fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, outs[1], accept_index.numel())
    twins.fill_accept_out_cache_loc(accept_index, out_cache_loc, outs[2], accept_index.numel())
    assert outs[0].tolist() == outs[2].tolist()
    assert outs[1].tolist() == outs[2].tolist()


def test_accept_out_cache_loc_without_accepted_slots_writes_nothing() -> None:
    out = torch.full((6,), JUNK, dtype=torch.int64)
    accept_index = torch.full((2, 3), -1, dtype=torch.int32)
    fill_accept_out_cache_loc_cpu(accept_index, torch.arange(8), out)
    assert out.tolist() == [JUNK] * 6


def _kv_buffers(gen: torch.Generator, slots: int, shapes: list[tuple[int, ...]]) -> list[Tensor]:
    dtypes = (torch.bfloat16, torch.float32, torch.float16)
    return [
        torch.randn((slots, *shape), generator=gen).to(dtypes[i % 3])
        for i, shape in enumerate(shapes)
    ]


def _pointers(buffers: list[Tensor]) -> tuple[Tensor, Tensor]:
    """SGLang's data_ptrs [n] uint64 and data_strides [n] int64 (bytes per slot row)."""
    ptrs = torch.tensor([x.data_ptr() for x in buffers], dtype=torch.uint64)
    strides = torch.tensor([x.stride(0) * x.element_size() for x in buffers])
    return ptrs, strides


@pytest.mark.parametrize(("num_locs", "overlap"), [(1, False), (5, True), (40, True)])
def test_copy_all_layer_kv_cache_matches_sglang_triton(
    twins: Twins, num_locs: int, overlap: bool
) -> None:
    gen = torch.Generator().manual_seed(num_locs)
    slots = 64
    # The Triton grid covers every buffer with the byte tiles of one row size: equal rows here.
    original = _kv_buffers(gen, slots, [(2, 8), (4, 4), (16,), (2, 4, 2)])
    original = [x.view(torch.uint8).view(slots, -1)[:, :64].contiguous() for x in original]
    src = torch.randperm(slots, generator=gen)[:num_locs]
    tgt = torch.roll(src, 1) if overlap else torch.randperm(slots, generator=gen)[:num_locs]
    ours = [x.clone() for x in original]
    theirs = [x.clone() for x in original]
    copy_all_layer_kv_cache_cpu(*_pointers(ours), tgt, src)
    config = {"bytes_per_tile": 32, "byte_tiles": 2, "num_warps": 4}
    twins.copy_all_layer_kv_cache(*_pointers(theirs), tgt, src, num_locs, _pow2(num_locs), config)
    for mine, twin, old in zip(ours, theirs, original, strict=True):
        assert torch.equal(mine, twin)
        assert torch.equal(mine[tgt], old[src])


def test_copy_all_layer_kv_cache_moves_rows_of_every_width() -> None:
    gen = torch.Generator().manual_seed(0)
    original = _kv_buffers(gen, 20, [(3, 5), (7,), (2, 2, 9)])
    buffers = [x.clone() for x in original]
    src, tgt = torch.tensor([0, 1, 2, 19]), torch.tensor([1, 2, 0, 3])
    copy_all_layer_kv_cache_cpu(*_pointers(buffers), tgt.int(), src.int())
    for moved, old in zip(buffers, original, strict=True):
        expected = old.clone()
        expected[tgt] = old[src]
        assert torch.equal(moved.view(torch.uint8), expected.view(torch.uint8))


def test_copy_all_layer_kv_cache_edge_cases() -> None:
    buffers = [torch.arange(12.0).view(4, 3)]
    before = buffers[0].clone()
    none = torch.zeros(0, dtype=torch.int64)
    copy_all_layer_kv_cache_cpu(*_pointers(buffers), none, none)
    copy_all_layer_kv_cache_cpu(*_pointers(buffers), torch.tensor([0]), torch.tensor([0]))
    assert torch.equal(buffers[0], before)
    with pytest.raises(ValueError, match=">= 0"):
        copy_all_layer_kv_cache_cpu(*_pointers(buffers), torch.tensor([-1]), torch.tensor([0]))


@pytest.mark.parametrize(("batch", "topk", "steps"), [(1, 1, 3), (2, 2, 3), (3, 4, 2), (2, 3, 0)])
def test_draft_decode_metadata_gives_each_branch_its_slots(
    batch: int, topk: int, steps: int
) -> None:
    gen = torch.Generator().manual_seed(batch + topk + steps)
    pool_len = 30
    table = _table(gen, 6, pool_len)
    rows = torch.randperm(6, generator=gen)[:batch]
    seq_lens = torch.randint(0, pool_len - topk * steps + 1, (batch,), generator=gen)
    out = build_draft_decode_metadata_cpu(table, rows, seq_lens, topk, steps, pool_len)
    assert out.shape == (batch * topk, pool_len)
    assert out.dtype == table.dtype
    for b, (r, n) in enumerate(zip(rows.tolist(), seq_lens.tolist(), strict=True)):
        for k in range(topk):
            branch = table[r, n + k * steps : n + (k + 1) * steps].tolist()
            assert out[b * topk + k, : n + steps].tolist() == table[r, :n].tolist() + branch


def test_empty_batches_are_no_ops() -> None:
    """An idle step (batch 0) goes through every op without touching the tables."""
    i32, i64 = torch.int32, torch.int64
    none32, none64 = torch.empty((0,), dtype=i32), torch.empty((0,), dtype=i64)
    table = _table(torch.Generator().manual_seed(0), 3, 10)
    before = table.clone()
    assign_draft_cache_locs_contiguous_cpu(none64, table, none64, none64, 10, 2, 2)
    assign_extend_cache_locs_cpu(none64, table, none64, none64, none64, 10)
    assign_req_to_token_pool_cpu(none32, table, none32, none32, none64, 10)
    fill_accept_out_cache_loc_cpu(torch.empty((0, 3), dtype=i32), none64, none64)
    assert build_draft_decode_metadata_cpu(table, none64, none64, 2, 3, 10).shape == (0, 10)
    assert torch.equal(table, before)
