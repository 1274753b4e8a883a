"""Torch attention backend (the CPU default): one batched SDPA call over a dense layout.

Per forward (:meth:`TorchAttention.plan`) the ragged batch becomes a dense layout with
``W = max_rows`` query rows and ``C = max_context`` context columns per request:

- column c of request b reads pool slot ``slot_table[req_rows[b], c]`` when ``c < cache_len[b]``
  (prefix), ``write_slots[cu_rows[b] + c - cache_len[b]]`` when it is one of the request's new
  rows, else the null slot (padding);
- ``mask[b, r, c] = prefix(c) or (new(c) and visible(r, c - cache_len[b]))`` with ``visible`` the
  causal rule or ``new_mask``; padded query rows see column 0 only (their output is dropped).

Per layer (:meth:`TorchAttention.attend`) K/V are gathered into ``[B, Hkv, C, D]`` (one
``index_select`` each) and ``softmax(q k^T * scale + mask) v`` runs as one
``scaled_dot_product_attention`` whose query rows are the ``G = H / Hkv`` query heads of each KV
head times the ``W`` rows (``[B, Hkv, G W, D]``): the same products as repeating K/V per query
head, without the copies (on the dev CPU at batch 8 this took the forward's attention from
about 82 to about 61 ms per decode step of plain decoding, its verify phase from 261 to 233 ms:
a one-off script, profile_attention.py at 87d8d57).

A verify pass where a few requests carry draft trees and the rest only their root pads every
request to the widest tree. :func:`split_roots` then plans the one-row requests and the tree
requests as two dense layouts (:class:`GroupedPlan`: one K/V gather and one SDPA per group and
layer), when that more than halves the padded query rows. Measured on the dev CPU (AMD EPYC, one
thread, batch 8, SmolLM2's 30 layers of 9/3 heads x 64, contexts 150-450, 15 interleaved rounds;
a one-off script, bench_grouped_attention.py at 87d8d57, output in
docs/bench/2026-12-02/grouped-attention): with one
request verifying 5 rows the split ran the forward's attention 1.20x faster than dense (95% CI
1.18-1.22). Grouping more finely does not pay: in a first run, rows [1, 1, 2, 2, 3, 3, 5, 6] went
0.96x with the split and 0.90x with one group per row count, and [1, 1, 1, 1, 1, 1, 3, 3] 0.98x
(each extra group costs its own K/V gather and SDPA per layer, and the gather of every request's
context, not the padded query rows, dominates there), so the rule leaves those dense.
``TorchAttention(group_rows=False)`` is dense always.

The mask is passed to SDPA as an additive float mask, ``0`` where visible and ``-inf`` elsewhere,
already repeated for the query-head groups: that is what SDPA makes of a boolean mask, and
:meth:`DensePlan.sdpa_mask` makes it once per forward instead of once per layer (a ``repeat``
and a boolean-to-float ``where`` per layer were 5-14% of the forward's attention for draft
trees at batch 8 on the Intel Xeon VM: docs/lab/2026-12-03.md). Same values, so the
same outputs bit for bit.

With ``TorchAttention(mirror=MirrorConfig(...))`` (what :class:`~echo_server.model.llama.
LlamaModel` builds by default) K/V are not gathered from the pool: each request keeps a
contiguous copy on its lane (slot-table row) of per-layer mirrors, brought up to date once per
forward by copying only the columns that changed, and a group of requests whose lanes form a
range with few gaps (at most a quarter of the group, or one) and whose longest context reaches
``MirrorConfig.min_context`` attends over a view of that range (:class:`MirrorPlan`,
:mod:`echo_server.model.kv_mirror`); other groups are still gathered from the pool.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from echo_server.model.attention import NULL_SLOT, AttentionBatch
from echo_server.model.kv_mirror import MirrorConfig, MirrorCopies, MirrorState, stale_columns


@dataclass(frozen=True, slots=True)
class DensePlan:
    """Dense per-request layout of one forward (module docstring)."""

    kv_index: Tensor  # [B, C] int64 pool slot per context column
    mask: Tensor | None  # [B, 1, W, C] bool; None when every row sees every column
    row_req: Tensor | None  # [R] int64 request of each packed row; None when rows are uniform
    row_local: Tensor | None  # [R] int64 request-local row index
    batch_size: int
    max_rows: int
    _sdpa_masks: dict[tuple[int, torch.dtype], Tensor] = field(
        default_factory=dict, compare=False, repr=False
    )

    def sdpa_mask(self, group: int, dtype: torch.dtype) -> Tensor | None:
        """The additive SDPA mask ``[B, 1, group W, C]`` (0 where ``mask``, -inf elsewhere, each
        row's block repeated for the ``group`` query heads of a KV head), built on the first
        layer's call and reused by the others (module docstring)."""
        if self.mask is None:
            return None
        key = (group, dtype)
        cached = self._sdpa_masks.get(key)
        if cached is None:
            keep = self.mask.repeat(1, 1, group, 1)
            cached = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
            cached.masked_fill_(~keep, float("-inf"))
            self._sdpa_masks[key] = cached
        return cached


@dataclass(frozen=True, slots=True)
class GroupedPlan:
    """One :class:`DensePlan` per group of requests (:func:`split_roots`: the one-row requests,
    then the others padded to their widest), module docstring.

    ``rows[g]``: [R_g] int64, the packed rows of group g in its plan's order (request-major).
    """

    rows: tuple[Tensor, ...]
    plans: tuple[DensePlan, ...]
    num_rows: int


@dataclass(frozen=True, slots=True)
class LaneGroup:
    """Requests on lanes ``lo..lo + plan.batch_size - 1`` of the mirrors, planned densely in lane
    order (lanes outside the group as empty requests). ``rows``: [R_g] int64, the forward's
    packed rows in the plan's order; None when that is every row in the forward's order."""

    plan: DensePlan
    lo: int
    rows: Tensor | None


@dataclass(frozen=True, slots=True)
class MirrorPlan:
    """A forward that reads (some of) its requests' K/V from the lane mirrors: the columns to
    copy in every layer, the mirrored groups, and the groups gathered from the pool (lanes too
    scattered to read as one range)."""

    state: MirrorState
    copies: MirrorCopies
    lanes: tuple[LaneGroup, ...]
    pooled: GroupedPlan | None


class TorchAttention:
    """Plain torch implementation of :class:`~echo_server.model.attention.AttentionBackend`."""

    def __init__(self, group_rows: bool = True, mirror: MirrorConfig | None = None) -> None:
        """``mirror``: read K/V from per-request lane mirrors
        (:mod:`echo_server.model.kv_mirror`); None: every layer gathers from the pool."""
        self.group_rows = group_rows
        self.mirror = mirror
        self._states: dict[int, MirrorState] = {}

    def plan(self, batch: AttentionBatch) -> DensePlan | GroupedPlan | MirrorPlan:
        groups = split_roots(batch.rows_host) if self.group_rows else None
        if self.mirror is not None:
            members = groups or [list(range(batch.batch_size))]
            mirrored = _mirror_plan(batch, members, self._state(batch.slot_table, self.mirror))
            if mirrored is not None:
                return mirrored
        if groups is not None:
            return _grouped_plan(batch, groups)
        return _dense_plan(batch)

    def _state(self, table: Tensor, config: MirrorConfig) -> MirrorState:
        """The mirrors of the pool that owns ``table`` (made on first use; those of pools that
        no longer exist are dropped)."""
        for key in [k for k, s in self._states.items() if s.table() is None]:
            del self._states[key]
        state = self._states.get(id(table))
        if state is None or state.table() is not table:
            state = self._states[id(table)] = MirrorState.new(table, config)
        return state

    def attend(
        self,
        plan: DensePlan | GroupedPlan | MirrorPlan,
        q: Tensor,  # [R, H, D]
        k_new: Tensor,  # [R, Hkv, D] (unused: read back from the pool)
        v_new: Tensor,  # [R, Hkv, D] (unused)
        k_cache: Tensor,  # [S, Hkv, D]
        v_cache: Tensor,  # [S, Hkv, D]
        scale: float,
    ) -> Tensor:
        if isinstance(plan, DensePlan):
            return _attend_dense(plan, q, k_cache, v_cache, scale)
        lanes: tuple[LaneGroup, ...] = ()
        pooled: GroupedPlan | None = plan if isinstance(plan, GroupedPlan) else None
        if isinstance(plan, MirrorPlan):
            mk, mv = plan.state.next_layer(k_cache, v_cache)
            plan.copies.apply(mk, k_cache)
            plan.copies.apply(mv, v_cache)
            lanes, pooled = plan.lanes, plan.pooled
            if lanes[0].rows is None:  # one group holding every row in order
                return _sdpa_dense(lanes[0].plan, q, *_lane_views(lanes[0], mk, mv), scale)
        out = q.new_empty(q.shape[0], q.shape[1], q.shape[2])
        for lane in lanes:
            assert lane.rows is not None
            part = _sdpa_dense(
                lane.plan, q.index_select(0, lane.rows), *_lane_views(lane, mk, mv), scale
            )
            out.index_copy_(0, lane.rows, part)
        if pooled is not None:
            for rows, sub in zip(pooled.rows, pooled.plans, strict=True):
                part = _attend_dense(sub, q.index_select(0, rows), k_cache, v_cache, scale)
                out.index_copy_(0, rows, part)
        return out


def _lane_views(lane: LaneGroup, mk: Tensor, mv: Tensor) -> tuple[Tensor, Tensor]:
    """K and V of ``lane``'s range of the mirrors up to its widest context: [span, Hkv, C, D]."""
    view, c = slice(lane.lo, lane.lo + lane.plan.batch_size), lane.plan.kv_index.shape[1]
    return mk[view, :, :c], mv[view, :, :c]


def split_roots(rows: tuple[int, ...]) -> list[list[int]] | None:
    """Requests with one new row apart from those with more, or None to stay dense.

    Dense padded query rows ``B W``; split ``n_1 + n_+ W_+`` (``n_1`` one-row requests, ``n_+``
    the others, ``W_+ = W``). Split only when that more than halves them: below, the second
    K/V gather and SDPA per layer cost about what the padding does (module docstring).
    """
    ones = [b for b, r in enumerate(rows) if r == 1]
    more = [b for b, r in enumerate(rows) if r > 1]
    if not ones or not more:
        return None
    width = max(rows)
    if 2 * (len(ones) + len(more) * width) >= len(rows) * width:
        return None
    return [ones, more]


def _mirror_plan(
    batch: AttentionBatch, groups: list[list[int]], state: MirrorState
) -> MirrorPlan | None:
    """Read every group of requests whose lanes form a range with few gaps (at most a quarter
    of its requests, or one) from the mirrors, the others from the pool; None when no group is
    mirrored (then the mirrors only forget the new rows of the lanes read from the pool)."""
    if state.in_flight:
        state.forget()
    context = [c + r for c, r in zip(batch.cache_len_host, batch.rows_host, strict=True)]
    if not state.lanes and max(context, default=0) < state.config.min_context:
        return None  # nothing mirrored yet, nor now: no lane to look at
    lanes = batch.req_rows.tolist()
    tight: list[list[int]] = []
    loose: list[list[int]] = []
    for members in groups:
        own = [lanes[b] for b in members]
        gaps = max(own) - min(own) + 1 - len(members)
        long = max(context[b] for b in members) >= state.config.min_context
        (tight if long and gaps <= max(1, len(members) // 4) else loose).append(members)
    if tight:
        need_lanes = max(lanes[b] for m in tight for b in m) + 1
        need_cols = max(context[b] for m in tight for b in m)
        if not state.reserve(need_lanes, need_cols):
            tight, loose = [], groups
    for members in loose:  # new rows read from the pool are not mirrored
        known = [b for b in members if lanes[b] < state.lanes]
        if known:
            dev = state.valid_upto.device
            index = torch.tensor([lanes[b] for b in known], dtype=torch.int64, device=dev)
            cache = torch.tensor([batch.cache_len_host[b] for b in known], device=dev)
            upto = torch.minimum(state.valid_upto.index_select(0, index), cache)
            state.valid_upto.index_copy_(0, index, upto)
    if not tight:
        return None
    planned = [_lane_group(batch, members, lanes, state) for members in tight]
    parts = [copies for _, copies in planned]
    copies = parts[0]
    if len(parts) > 1:
        copies = MirrorCopies(
            *(torch.cat(t) for t in zip(*((p.lanes, p.cols, p.slots) for p in parts), strict=True))
        )
    pooled = _grouped_plan(batch, loose) if loose else None
    state.begin()
    return MirrorPlan(state, copies, tuple(group for group, _ in planned), pooled)


def _lane_group(
    batch: AttentionBatch, members: list[int], lanes: list[int], state: MirrorState
) -> tuple[LaneGroup, MirrorCopies]:
    """``members`` (indices into ``batch``) planned over their lane range, and the columns of
    those lanes the forward copies (:func:`~echo_server.model.kv_mirror.stale_columns`)."""
    dev = batch.cu_rows.device
    by_lane = {lanes[b]: b for b in members}
    lo, hi = min(by_lane), max(by_lane) + 1
    slots = [by_lane.get(lane) for lane in range(lo, hi)]  # None: a lane outside the group
    req_rows = torch.arange(lo, hi, dtype=torch.int64, device=dev)
    sub, rows = _sub_batch(batch, slots, req_rows)
    plan = _dense_plan(sub)
    present = torch.tensor([b is not None for b in slots], dtype=torch.bool, device=dev)
    new = torch.tensor(sub.rows_host, dtype=torch.int64, device=dev)
    copies = stale_columns(state, lo, plan.kv_index, sub.cache_len, sub.cache_len + new, present)
    return LaneGroup(plan, lo, rows), copies


def _grouped_plan(batch: AttentionBatch, groups: list[list[int]]) -> GroupedPlan:
    """Plan each group of requests (indices into ``batch``) densely on its own."""
    rows_out, plans = [], []
    for members in groups:
        index = torch.tensor(members, dtype=torch.int64, device=batch.cu_rows.device)
        sub, rows = _sub_batch(batch, members, batch.req_rows.index_select(0, index))
        rows_out.append(
            rows if rows is not None else torch.arange(batch.num_rows, device=index.device)
        )
        plans.append(_dense_plan(sub))
    return GroupedPlan(tuple(rows_out), tuple(plans), batch.num_rows)


def _sub_batch(
    batch: AttentionBatch, members: Sequence[int | None], req_rows: Tensor
) -> tuple[AttentionBatch, Tensor | None]:
    """``batch`` restricted to ``members`` in that order (None: an empty request, no rows and no
    context) on slot-table rows ``req_rows``, and the packed rows of ``batch`` it holds in its
    order ([R_g] int64; None when that is every row in order)."""
    dev = batch.cu_rows.device
    starts = [0, *itertools.accumulate(batch.rows_host)]  # host copy of cu_rows
    counts = [0 if b is None else batch.rows_host[b] for b in members]
    caches = [0 if b is None else batch.cache_len_host[b] for b in members]
    packed = [j for b in members if b is not None for j in range(starts[b], starts[b + 1])]
    rows = None
    write, new_mask = batch.write_slots, batch.new_mask
    if packed != list(range(batch.num_rows)):
        rows = torch.tensor(packed, dtype=torch.int64, device=dev)
        write = write.index_select(0, rows)
        if new_mask is not None:
            new_mask = new_mask[rows, : max(counts)]
    sub = AttentionBatch(
        cu_rows=torch.tensor([0, *itertools.accumulate(counts)], dtype=torch.int64, device=dev),
        cache_len=torch.tensor(caches, dtype=torch.int64, device=dev),
        req_rows=req_rows,
        slot_table=batch.slot_table,
        write_slots=write,
        new_mask=new_mask,
        rows_host=tuple(counts),
        cache_len_host=tuple(caches),
    )
    return sub, rows


def _dense_plan(batch: AttentionBatch) -> DensePlan:
    """Every request padded to ``W = max_rows`` rows and ``C = max_context`` columns."""
    dev = batch.cu_rows.device
    b, w, c = batch.batch_size, batch.max_rows, batch.max_context
    rows = batch.cu_rows[1:] - batch.cu_rows[:-1]  # [B]
    col = torch.arange(c, device=dev)  # [C]
    rel = col[None, :] - batch.cache_len[:, None]  # [B, C] index among the new rows
    in_prefix = rel < 0
    in_new = (rel >= 0) & (rel < rows[:, None])
    table = batch.slot_table[batch.req_rows[:, None], col.clamp(max=batch.slot_table.shape[1] - 1)]
    new_row = (batch.cu_rows[:-1, None] + rel).clamp(0, max(batch.num_rows - 1, 0))
    new_slot = batch.write_slots[new_row] if batch.num_rows else torch.zeros_like(table)
    kv_index = torch.where(in_prefix, table, torch.where(in_new, new_slot, NULL_SLOT))

    uniform = all(r == w for r in batch.rows_host)
    row_req = row_local = None
    if not uniform:
        row_req = torch.repeat_interleave(torch.arange(b, device=dev), rows)
        row_local = torch.arange(batch.num_rows, device=dev) - batch.cu_rows[:-1][row_req]

    full_context = len(set(batch.cache_len_host)) <= 1
    if batch.new_mask is None and w == 1 and uniform and full_context:
        return DensePlan(kv_index, None, row_req, row_local, b, w)  # decode: all visible
    r_idx = torch.arange(w, device=dev)
    if batch.new_mask is None:
        visible = rel[:, None, :] <= r_idx[None, :, None]  # [B, W, C] causal
    else:
        local_mask = torch.zeros(b, w, w, dtype=torch.bool, device=dev)
        if uniform:
            local_mask = batch.new_mask.view(b, w, w)
        else:
            local_mask[row_req, row_local] = batch.new_mask
        gather_at = rel.clamp(0, max(w - 1, 0))[:, None, :].expand(b, w, c)
        visible = torch.gather(local_mask, 2, gather_at)
    mask = in_prefix[:, None, :] | (in_new[:, None, :] & visible)
    pad_row = r_idx[None, :] >= rows[:, None]  # [B, W]
    mask = torch.where(pad_row[:, :, None], col[None, None, :] == 0, mask)
    return DensePlan(kv_index, mask.unsqueeze(1), row_req, row_local, b, w)


def _attend_dense(
    plan: DensePlan,
    q: Tensor,  # [R, H, D]
    k_cache: Tensor,  # [S, Hkv, D]
    v_cache: Tensor,  # [S, Hkv, D]
    scale: float,
) -> Tensor:
    """Gather the context from the pool, then :func:`_sdpa_dense`: [R, H, D]."""
    b, c = plan.kv_index.shape
    kv_heads, dim = k_cache.shape[1], k_cache.shape[2]
    flat = plan.kv_index.reshape(-1)
    k = torch.index_select(k_cache, 0, flat).view(b, c, kv_heads, dim).transpose(1, 2)
    v = torch.index_select(v_cache, 0, flat).view(b, c, kv_heads, dim).transpose(1, 2)
    return _sdpa_dense(plan, q, k, v, scale)


def _sdpa_dense(
    plan: DensePlan,
    q: Tensor,  # [R, H, D]
    k: Tensor,  # [B, Hkv, C, D], any strides
    v: Tensor,  # [B, Hkv, C, D]
    scale: float,
) -> Tensor:
    """One SDPA over the dense layout ``plan`` (module docstring): [R, H, D]."""
    b, w = plan.batch_size, plan.max_rows
    heads, dim = q.shape[1], q.shape[2]
    kv_heads = k.shape[1]
    group = heads // kv_heads  # query heads per KV head (GQA)
    if plan.row_req is None:
        q_dense = q.view(b, w, heads, dim)
    else:
        q_dense = q.new_zeros(b, w, heads, dim)
        q_dense[plan.row_req, plan.row_local] = q
    # Query heads grouped under their KV head (head h reads KV head h // group): one SDPA
    # over [B, Hkv, group * W] query rows, so K/V are never repeated per query head.
    q_grouped = (
        q_dense.view(b, w, kv_heads, group, dim)
        .permute(0, 2, 3, 1, 4)
        .reshape(b, kv_heads, group * w, dim)
    )
    mask = plan.sdpa_mask(group, q.dtype)  # [B, 1, gW, C] additive, built once per plan
    out = F.scaled_dot_product_attention(q_grouped, k, v, attn_mask=mask, scale=scale)
    out = out.view(b, kv_heads, group, w, dim).permute(0, 3, 1, 2, 4).reshape(b, w, heads, dim)
    if plan.row_req is None:
        return out.reshape(b * w, heads, dim)
    return out[plan.row_req, plan.row_local]
