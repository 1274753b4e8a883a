"""KV-slot bookkeeping of SGLang's CPU speculative path: req_to_token rows and cache moves.

Pure-torch versions of the ``sgl_kernel`` CPU ops that SGLang 0.5.23 calls from
``sglang/kernels/ops/speculative/cache_locs.py`` (assign_draft_cache_locs_contiguous_cpu,
assign_extend_cache_locs_cpu), ``sglang/srt/mem_cache/allocation.py``
(assign_req_to_token_pool_cpu), ``sglang/kernels/ops/speculative/eagle.py``
(fill_accept_out_cache_loc_cpu), ``sglang/kernels/ops/kvcache/cache_move.py``
(copy_all_layer_kv_cache_cpu) and ``sglang/srt/layers/attention/intel_amx_backend.py``
(build_draft_decode_metadata_cpu).

``req_to_token`` is the [R, pool_len] int32 table whose row r lists the KV slot of every token
of request-pool entry r; the kernels address it as the flat array ``r * pool_len + column``, and
so do these functions.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from sgl_kernel.spec_checks import as_long, flat_view, require_integer


def _spans(starts: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """Request id and offset inside its span of every element of consecutive spans.

    For lengths (2, 0, 3): ids (0, 0, 2, 2, 2), offsets (0, 1, 0, 1, 2); negative lengths count
    as empty. ``starts`` is only checked against ``lengths`` for shape.
    """
    if starts.shape != lengths.shape:
        raise ValueError(f"starts {tuple(starts.shape)} and lengths {tuple(lengths.shape)} differ")
    counts = lengths.clamp(min=0)
    ids = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    first = torch.cumsum(counts, 0) - counts
    return ids, torch.arange(ids.numel()) - first[ids]


def _span_copy_indices(
    req_pool_indices: Tensor, start_offset: Tensor, end_offset: Tensor, pool_len: int
) -> tuple[Tensor, Tensor]:
    """Flat req_to_token cells and packed positions of ``[start, end)`` of every request.

    Request i's cells ``req_pool_indices[i] * pool_len + start[i] + j`` (j < end[i] - start[i])
    pair with packed position ``sum_{k<i}(end[k] - start[k]) + j``, as SGLang's kernels lay
    them out.
    """
    rows = as_long(req_pool_indices, "req_pool_indices")
    start = as_long(start_offset, "start_offset")
    length = as_long(end_offset, "end_offset") - start
    if rows.shape != start.shape:
        raise ValueError(f"req_pool_indices {tuple(rows.shape)} and offsets differ in shape")
    ids, offset = _spans(start, length)
    packed = (torch.cumsum(length, 0) - length)[ids] + offset
    return rows[ids] * pool_len + start[ids] + offset, packed


def assign_extend_cache_locs_cpu(
    req_pool_indices: Tensor,  # [B] int, req_to_token row of every request
    req_to_token: Tensor,  # [R, pool_len] int32
    start_offset: Tensor,  # [B] int, first column to read
    end_offset: Tensor,  # [B] int, one past the last column
    out_cache_loc: Tensor,  # [sum(end - start)] int64, written
    pool_len: int,  # row stride of req_to_token
) -> None:
    """Gather the KV slots of columns ``[start, end)`` of every request, packed in order.

    ``out_cache_loc[sum_{k<i} len_k + j] = req_to_token[req_pool_indices[i], start[i] + j]``.
    """
    cells, packed = _span_copy_indices(req_pool_indices, start_offset, end_offset, pool_len)
    table = flat_view(req_to_token, "req_to_token")
    out = flat_view(out_cache_loc, "out_cache_loc")
    out[packed] = table[cells].to(out.dtype)


def assign_req_to_token_pool_cpu(
    req_pool_indices: Tensor,  # [B] int, req_to_token row of every request
    req_to_token: Tensor,  # [R, pool_len] int32, written
    start_offset: Tensor,  # [B] int, first column to write
    end_offset: Tensor,  # [B] int, one past the last column
    out_cache_loc: Tensor,  # [sum(end - start)] int64, the new slots, packed
    pool_len: int,  # row stride of req_to_token
) -> None:
    """Scatter newly allocated KV slots into columns ``[start, end)`` of every request's row.

    ``req_to_token[req_pool_indices[i], start[i] + j] = out_cache_loc[sum_{k<i} len_k + j]``:
    the inverse of assign_extend_cache_locs_cpu.
    """
    cells, packed = _span_copy_indices(req_pool_indices, start_offset, end_offset, pool_len)
    table = flat_view(req_to_token, "req_to_token")
    table[cells] = flat_view(out_cache_loc, "out_cache_loc")[packed].to(table.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: Tensor,  # [B] int
    req_to_token: Tensor,  # [R, pool_len] int32
    seq_lens: Tensor,  # [B] int, first draft column of every request
    out_cache_loc: Tensor,  # [B * topk * num_steps] int64, written
    pool_len: int,  # row stride of req_to_token
    topk: int,
    num_steps: int,
) -> None:
    """Gather the ``topk * num_steps`` draft slots that follow each request's sequence.

    ``out_cache_loc[i * W + j] = req_to_token[req_pool_indices[i], seq_lens[i] + j]`` for
    ``j < W = topk * num_steps`` (the slot layout for page_size 1 or topk 1).
    """
    rows = as_long(req_pool_indices, "req_pool_indices")
    start = as_long(seq_lens, "seq_lens")
    width = topk * num_steps
    if rows.shape != start.shape or width < 0:
        raise ValueError(
            f"req_pool_indices {tuple(rows.shape)} and seq_lens {tuple(start.shape)} must match "
            f"and topk * num_steps = {width} be >= 0"
        )
    cells = (rows * pool_len + start).unsqueeze(1) + torch.arange(width)
    out = flat_view(out_cache_loc, "out_cache_loc", cells.numel())
    out[: cells.numel()] = flat_view(req_to_token, "req_to_token")[cells.view(-1)].to(out.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: Tensor,  # [B, L] int32, accepted flat slots, -1 elsewhere
    out_cache_loc: Tensor,  # [B * T] int64, KV slot of every verify token
    accept_out_cache_loc: Tensor,  # [>= accepted] int64, written from the front
    size: int | None = None,  # entries of accept_index to scan; all when None
) -> None:
    """Pack the KV slots of the accepted tokens: the compaction of ``out_cache_loc[accept_index]``
    over the entries that are not -1, in order, written to the front of accept_out_cache_loc.

    SGLang 0.5.23 calls this with three arguments; older sgl_kernel builds took ``size`` too.
    """
    index = as_long(accept_index, "accept_index")
    if size is not None:
        index = index[:size]
    picked = index[index >= 0]
    out = flat_view(accept_out_cache_loc, "accept_out_cache_loc", picked.numel())
    out[: picked.numel()] = flat_view(out_cache_loc, "out_cache_loc")[picked].to(out.dtype)


def build_draft_decode_metadata_cpu(
    req_to_token: Tensor,  # [R, pool_len] int32
    req_pool_indices: Tensor,  # [B] int
    seq_lens: Tensor,  # [B] int, prefix length of every request
    topk: int,
    num_steps: int,
    pool_len: int,  # row stride of req_to_token
) -> Tensor:
    """A req_to_token table [B * topk, pool_len] with one row per draft branch.

    Row ``b topk + k`` is request b's row whose columns ``[seq_len, seq_len + num_steps)`` are
    replaced by branch k's draft slots, taken from columns ``seq_len + k num_steps + s`` (the
    branch-major draft layout), so a decode kernel sees prefix + branch as one sequence. Columns
    past ``seq_len + num_steps`` keep request b's entries (the compiled kernel leaves them unset).
    """
    rows = as_long(req_pool_indices, "req_pool_indices")
    start = as_long(seq_lens, "seq_lens")
    if rows.shape != start.shape or topk < 1 or num_steps < 0:
        raise ValueError(
            f"req_pool_indices {tuple(rows.shape)} and seq_lens {tuple(start.shape)} must match, "
            f"topk ({topk}) be >= 1 and num_steps ({num_steps}) >= 0"
        )
    table = flat_view(req_to_token, "req_to_token").view(-1, pool_len)
    base = table[rows]  # [B, pool_len], a copy
    steps = torch.arange(num_steps)
    branch = torch.arange(topk).view(1, topk, 1) * num_steps
    source = start.view(-1, 1, 1) + branch + steps  # [B, topk, num_steps]
    drafts = base.gather(1, source.view(rows.numel(), topk * num_steps))
    drafts = drafts.view(rows.numel() * topk, num_steps)
    out = base.repeat_interleave(topk, dim=0)
    columns = (start.view(-1, 1) + steps).repeat_interleave(topk, dim=0)
    out.scatter_(1, columns, drafts)
    return out


def copy_all_layer_kv_cache_cpu(
    data_ptrs: Tensor,  # [num_buffers] uint64, base address of every K/V buffer
    strides: Tensor,  # [num_buffers] int64, bytes per slot row of every buffer
    tgt_loc: Tensor,  # [N] int, slots to write
    src_loc: Tensor,  # [N] int, slots to read
) -> None:
    """Move KV rows in every buffer: ``buf[tgt_loc[i], :] = buf[src_loc[i], :]`` for all i.

    The buffers are raw CPU addresses, as SGLang's KV pool hands them over, each viewed as
    ``[rows, stride]`` bytes. All source rows of a buffer are read before any target row is
    written, so overlapping tgt/src sets copy the old contents, like the kernels.
    """
    require_integer(tgt_loc, "tgt_loc")
    require_integer(src_loc, "src_loc")
    if data_ptrs.numel() != strides.numel() or tgt_loc.numel() != src_loc.numel():
        raise ValueError(
            f"data_ptrs ({data_ptrs.numel()}) / strides ({strides.numel()}) and tgt_loc "
            f"({tgt_loc.numel()}) / src_loc ({src_loc.numel()}) must pair up"
        )
    if data_ptrs.device.type != "cpu":
        raise ValueError(f"data_ptrs must address CPU buffers, got {data_ptrs.device}")
    tgt = tgt_loc.reshape(-1).to(torch.int64)
    src = src_loc.reshape(-1).to(torch.int64)
    if tgt.numel() == 0 or data_ptrs.numel() == 0:
        return
    lowest = min(int(tgt.min()), int(src.min()))
    if lowest < 0:
        raise ValueError(f"tgt_loc and src_loc must be >= 0, got {lowest}")
    num_rows = max(int(tgt.max()), int(src.max())) + 1
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        if row_bytes < 0:
            raise ValueError(f"strides must be >= 0 bytes, got {row_bytes}")
        if row_bytes == 0:
            continue
        raw = (ctypes.c_uint8 * (num_rows * row_bytes)).from_address(address)
        rows = torch.frombuffer(raw, dtype=torch.uint8).view(num_rows, row_bytes)
        rows[tgt] = rows[src]
