"""The raw Triton kernels: the only module of the package that imports triton.

Imported lazily by the launchers (``tree_attention.py``, ``acceptance.py``, ``kv_commit.py``),
never at package import, so echo-kernels imports and serves without triton. Kernels never
validate: their launchers check ndim, dtype, contiguity and shapes first. Index arithmetic runs
in int64 (program ids are widened) so pools and tables past 2**31 elements stay addressable.

Typing: triton ships no stubs, so ``@triton.jit`` is an untyped decorator
(``untyped-decorator``) and kernel parameters stay unannotated (``no-untyped-def``): Triton reads
parameter annotations itself (``tl.constexpr``), so typing them for mypy would change how kernels
specialise. Compile-time parameters are UPPER_CASE, Triton's convention (hence N803 off here).
"""

# ruff: noqa: N803

from __future__ import annotations

import triton
import triton.language as tl

NEG_INF = tl.constexpr(-1.0e30)
"""Finite "minus infinity" of masked scores: all-masked blocks stay NaN-free (their garbage is
wiped by the next block's rescale factor exp2(NEG_INF - m) = 0)."""


@triton.jit  # type: ignore[untyped-decorator]
def tree_attention_kernel(  # type: ignore[no-untyped-def]
    q_ptr,  # [R, Hq, D] rows contiguous in D
    k_new_ptr,  # [R, Hkv, D]
    v_new_ptr,  # [R, Hkv, D]
    k_pool_ptr,  # [num_slots, Hkv, D]
    v_pool_ptr,  # [num_slots, Hkv, D]
    out_ptr,  # [R, Hq, D], q's strides
    cu_rows_ptr,  # [B+1] int64
    positions_ptr,  # [R] int64
    cache_len_ptr,  # [B] int64
    req_to_slot_ptr,  # [B, max_ctx] int64
    tree_bits_ptr,  # [R, W] int32
    causal_ptr,  # [B] int8
    stride_q_row,
    stride_q_head,
    stride_new_row,
    stride_new_head,
    stride_pool_slot,
    stride_pool_head,
    stride_table,
    num_words,
    qk_scale,  # softmax scale * log2(e): scores live in the exp2 domain
    window,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_M: tl.constexpr,  # (row, head-in-group) pairs per program
    BLOCK_N: tl.constexpr,  # keys per iteration
    BLOCK_D: tl.constexpr,  # next power of two >= HEAD_DIM
    HAS_WINDOW: tl.constexpr,
    UPCAST: tl.constexpr,  # compute dots in float32 (the interpreter's bf16 dot is broken)
    DOT_PRECISION: tl.constexpr,  # "ieee" or "tf32" for float32 inputs
):
    # Program (b, blk, kvh): rows of request b packed with the GROUP query heads of KV head kvh
    # along M (m = local_row * GROUP + g), so the K/V tile loaded once serves the whole group.
    b = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1).to(tl.int64)
    kvh = tl.program_id(2).to(tl.int64)
    row_lo = tl.load(cu_rows_ptr + b)
    n_rows = tl.load(cu_rows_ptr + b + 1) - row_lo
    if blk * BLOCK_M >= n_rows * GROUP:
        return
    offs_m = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    local_row = offs_m // GROUP
    head = kvh * GROUP + offs_m % GROUP
    m_valid = local_row < n_rows
    row = row_lo + local_row
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < HEAD_DIM
    q_off = row[:, None] * stride_q_row + head[:, None] * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=m_valid[:, None] & d_valid[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    q_pos = tl.load(positions_ptr + row, mask=m_valid, other=0)
    m_i = tl.full([BLOCK_M], NEG_INF, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Phase 1: the cached prefix, gathered slot by slot through the request's table row.
    cache_len = tl.load(cache_len_ptr + b)
    start = cache_len * 0
    if HAS_WINDOW:  # skip prefix blocks that fell out of every row's window
        first_pos = tl.min(tl.where(m_valid, q_pos, q_pos + cache_len + window), axis=0)
        start = tl.maximum(first_pos - window + 1, 0) // BLOCK_N * BLOCK_N
    for kv_start in range(start, cache_len, BLOCK_N):
        offs_n = kv_start + tl.arange(0, BLOCK_N)
        n_valid = offs_n < cache_len
        slot = tl.load(req_to_slot_ptr + b * stride_table + offs_n, mask=n_valid, other=0)
        kv_off = slot * stride_pool_slot + kvh * stride_pool_head
        allowed = m_valid[:, None] & n_valid[None, :]
        if HAS_WINDOW:
            allowed = allowed & ((q_pos[:, None] - offs_n[None, :]) < window)
        m_i, l_i, acc = _attend(
            q, k_pool_ptr, v_pool_ptr, kv_off, n_valid, offs_d, d_valid, allowed,
            m_i, l_i, acc, qk_scale, UPCAST, DOT_PRECISION,
        )  # fmt: skip

    # Phase 2: the request's new rows. Visible rows never follow the query (parents precede
    # children; causal is causal), so the scan stops after the block's last row.
    is_causal = tl.load(causal_ptr + b)  # int8 scalar, 1 = causal chain
    tree_end = tl.minimum((blk * BLOCK_M + BLOCK_M - 1) // GROUP + 1, n_rows)
    for col_start in range(0, tree_end, BLOCK_N):
        offs_c = col_start + tl.arange(0, BLOCK_N)
        c_valid = offs_c < tree_end
        kv_row = row_lo + offs_c
        kv_off = kv_row * stride_new_row + kvh * stride_new_head
        tile = m_valid[:, None] & c_valid[None, :]
        word = tl.load(
            tree_bits_ptr + row[:, None] * num_words + (offs_c // 32)[None, :],
            mask=tile & ((offs_c // 32) < num_words)[None, :],
            other=0,
        )
        in_tree = ((word >> (offs_c % 32)[None, :]) & 1) != 0
        in_chain = offs_c[None, :] <= local_row[:, None]
        allowed = tile & tl.where(is_causal != 0, in_chain, in_tree)
        if HAS_WINDOW:
            k_pos = tl.load(positions_ptr + kv_row, mask=c_valid, other=0)
            allowed = allowed & ((q_pos[:, None] - k_pos[None, :]) < window)
        m_i, l_i, acc = _attend(
            q, k_new_ptr, v_new_ptr, kv_off, c_valid, offs_d, d_valid, allowed,
            m_i, l_i, acc, qk_scale, UPCAST, DOT_PRECISION,
        )  # fmt: skip

    out = acc / l_i[:, None]
    tl.store(
        out_ptr + q_off,
        out.to(out_ptr.dtype.element_ty),
        mask=m_valid[:, None] & d_valid[None, :],
    )


@triton.jit  # type: ignore[untyped-decorator]
def _attend(  # type: ignore[no-untyped-def]
    q, k_ptr, v_ptr, kv_off, kv_valid, offs_d, d_valid, allowed, m_i, l_i, acc, qk_scale,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    # One online-softmax step over a tile of keys at element offsets kv_off ([BLOCK_N]):
    # scores of the allowed (query, key) pairs, rescale of the running max / sum / output.
    k = tl.load(
        k_ptr + kv_off[None, :] + offs_d[:, None],
        mask=kv_valid[None, :] & d_valid[:, None],
        other=0.0,
    )  # [BLOCK_D, BLOCK_N]
    v = tl.load(
        v_ptr + kv_off[:, None] + offs_d[None, :],
        mask=kv_valid[:, None] & d_valid[None, :],
        other=0.0,
    )  # [BLOCK_N, BLOCK_D]
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(allowed, s, NEG_INF)
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit  # type: ignore[untyped-decorator]
def greedy_accept_kernel(  # type: ignore[no-untyped-def]
    token_ptr,  # [N] int64
    parent_ptr,  # [N] int64, request-local, -1 = root
    depth_ptr,  # [N] int64
    cu_nodes_ptr,  # [B+1] int64
    argmax_ptr,  # [B+N] int64, target argmax per verify row
    accepted_ptr,  # [B, width] int64, pre-filled with -1
    num_accepted_ptr,  # [B] int64
    bonus_ptr,  # [B] int64
    width,
    BLOCK: tl.constexpr,
):
    # One program per request. Every lane walks its node's path up to the root and checks
    # token == argmax at the parent's row on the way; reads only, so lanes never race.
    b = tl.program_id(0).to(tl.int64)
    lo = tl.load(cu_nodes_ptr + b)
    n = tl.load(cu_nodes_ptr + b + 1) - lo
    root_row = lo + b  # verify row of the root; node i sits at root_row + 1 + i
    best = n * 0  # key depth * (n + 1) + (n - i) of the best fully matching node, 0 = none
    for start in range(0, n, BLOCK):
        local = start + tl.arange(0, BLOCK)
        valid = local < n
        ok = valid
        cur = tl.where(valid, local, -1)
        while tl.max(cur, axis=0) >= 0:
            live = cur >= 0
            tok = tl.load(token_ptr + lo + cur, mask=live, other=0)
            par = tl.load(parent_ptr + lo + cur, mask=live, other=-1)
            am = tl.load(argmax_ptr + root_row + 1 + par, mask=live, other=-1)
            ok = ok & ((tok == am) | (cur < 0))
            cur = tl.where(live & ok, par, -1)
        depth = tl.load(depth_ptr + lo + local, mask=valid, other=0)
        key = tl.where(ok, depth * (n + 1) + (n - local), 0)
        best = tl.maximum(best, tl.max(key, axis=0))
    length = best // (n + 1)
    leaf = tl.where(length > 0, n - best % (n + 1), -1)
    tl.store(num_accepted_ptr + b, length)
    tl.store(bonus_ptr + b, tl.load(argmax_ptr + root_row + 1 + leaf))  # leaf -1: the root row
    _write_path(parent_ptr + lo, depth_ptr + lo, accepted_ptr + b * width, leaf)


@triton.jit
def _write_path(parent_ptr, depth_ptr, out_ptr, leaf):  # type: ignore[no-untyped-def]
    # Store the request-local path root -> leaf at out[depth - 1], walking leaf -> root.
    while leaf >= 0:
        depth = tl.load(depth_ptr + leaf)
        tl.store(out_ptr + depth - 1, leaf)
        leaf = tl.load(parent_ptr + leaf)


@triton.jit  # type: ignore[untyped-decorator]
def kv_commit_kernel(  # type: ignore[no-untyped-def]
    req_to_slot_ptr,  # [rows, max_ctx] int64, updated in place
    req_rows_ptr,  # [B] int64, distinct: the req_to_slot row of each request
    cache_len_ptr,  # [B] int64
    row_slots_ptr,  # [B+N] int64, pool slot of every verify row
    cu_nodes_ptr,  # [B+1] int64
    accepted_ptr,  # [B, width] int64, request-local accepted nodes in depth order
    num_accepted_ptr,  # [B] int64
    keep_ptr,  # [B+N] int8, zero-filled; set to 1 for every kept row
    new_len_ptr,  # [B] int64
    stride_table,
    width,
    BLOCK: tl.constexpr,
):
    # One program per request: the root's slot goes to position cache_len, then the accepted
    # nodes' slots in depth order. Only the table changes; KV stays where the verify pass put it.
    b = tl.program_id(0).to(tl.int64)
    root_row = tl.load(cu_nodes_ptr + b) + b
    cached = tl.load(cache_len_ptr + b)
    count = tl.load(num_accepted_ptr + b)
    table = req_to_slot_ptr + tl.load(req_rows_ptr + b) * stride_table + cached
    tl.store(table, tl.load(row_slots_ptr + root_row))
    tl.store(keep_ptr + root_row, 1)
    for start in range(0, count, BLOCK):
        j = start + tl.arange(0, BLOCK)
        valid = j < count
        node = tl.load(accepted_ptr + b * width + j, mask=valid, other=0)
        row = root_row + 1 + node
        tl.store(table + 1 + j, tl.load(row_slots_ptr + row, mask=valid, other=0), mask=valid)
        tl.store(keep_ptr + row, tl.full([BLOCK], 1, tl.int8), mask=valid)
    tl.store(new_len_ptr + b, cached + 1 + count)


@triton.jit  # type: ignore[untyped-decorator]
def _copy_row(src_ptr, dst_ptr, vocab, BLOCK_V: tl.constexpr):  # type: ignore[no-untyped-def]
    # dst[:vocab] = src[:vocab]; returns sum(src) (float32).
    total = tl.zeros([BLOCK_V], tl.float32)
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        x = tl.load(src_ptr + offs, mask=offs < vocab, other=0.0)
        tl.store(dst_ptr + offs, x, mask=offs < vocab)
        total += x
    return tl.sum(total, axis=0)


@triton.jit  # type: ignore[untyped-decorator]
def _last(x, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    # x[BLOCK - 1] exactly (a sum of one value and zeros), unlike max on a float scan.
    return tl.sum(tl.where(tl.arange(0, BLOCK) == BLOCK - 1, x, 0.0), axis=0)


@triton.jit  # type: ignore[untyped-decorator]
def _residual(  # type: ignore[no-untyped-def]
    p_ptr, q_ptr, token, vocab, SAMPLED: tl.constexpr, NORMALISE: tl.constexpr,
    mass, BLOCK_V: tl.constexpr,
):  # fmt: skip
    # The residual after a rejected candidate: max(p - q, 0) (sampled) or p without `token`
    # (deterministic). NORMALISE=False: returns its mass, read only. NORMALISE=True: p <- r / mass
    # in place (each element is read and written by the same lanes) and returns sum(new p).
    total = tl.zeros([BLOCK_V], tl.float32)
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        valid = offs < vocab
        p = tl.load(p_ptr + offs, mask=valid, other=0.0)
        if SAMPLED:
            q = tl.load(q_ptr + offs, mask=valid, other=0.0)
            r = tl.maximum(p - q, 0.0)
        else:
            r = tl.where(offs == token, 0.0, p)
        if NORMALISE:
            r = r / mass
            tl.store(p_ptr + offs, r, mask=valid)
        total += r
    return tl.sum(total, axis=0)


@triton.jit  # type: ignore[untyped-decorator]
def stochastic_accept_kernel(  # type: ignore[no-untyped-def]
    token_ptr,  # [N] int64
    parent_ptr,  # [N] int64, request-local, -1 = root
    depth_ptr,  # [N] int64
    cu_nodes_ptr,  # [B+1] int64
    sampled_ptr,  # [N] int8, 1 = drawn from the draft distribution
    target_ptr,  # [B+N, V] float32, rows contiguous
    draft_ptr,  # [B+N, V] float32 (target_ptr when HAS_DRAFT is False)
    u_node_ptr,  # [N] float32
    u_bonus_ptr,  # [B] float32
    scratch_ptr,  # [B, V] float32: the residual distribution of each request
    accepted_ptr,  # [B, width] int64, pre-filled with -1
    num_accepted_ptr,  # [B] int64
    bonus_ptr,  # [B] int64
    vocab,
    width,
    HAS_DRAFT: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    # One program per request; echo_core.acceptance_stochastic states the rule. A forward scan
    # over the nodes meets the current node's children in node order (children follow their
    # parent), so accepting a child just moves `cur` and the scan continues. The residual p
    # lives in scratch; a barrier orders every pass that rewrote it before the next reads it.
    b = tl.program_id(0).to(tl.int64)
    lo = tl.load(cu_nodes_ptr + b)
    n = tl.load(cu_nodes_ptr + b + 1) - lo
    root_row = lo + b
    p_ptr = scratch_ptr + b * vocab
    psum = _copy_row(target_ptr + root_row * vocab, p_ptr, vocab, BLOCK_V)
    cur = lo * 0 - 1  # request-local id of the last accepted node, -1 = root
    i = lo * 0
    while i < n:
        if tl.load(parent_ptr + lo + i) == cur:
            tok = tl.load(token_ptr + lo + i)
            u = tl.load(u_node_ptr + lo + i)
            cur_row = root_row + 1 + cur
            tl.debug_barrier()
            px = tl.load(p_ptr + tok)
            is_sampled = False
            if HAS_DRAFT:
                is_sampled = tl.load(sampled_ptr + lo + i) != 0
            if is_sampled:
                q_row = draft_ptr + cur_row * vocab
                # u < min(1, p/q) == u < p/q for u in [0, 1), NaN (0/0) rejecting as in torch.
                if u < px / tl.load(q_row + tok):
                    cur = i
                else:
                    mass = _residual(p_ptr, q_row, tok, vocab, True, False, 1.0, BLOCK_V)
                    if mass > 0:
                        psum = _residual(p_ptr, q_row, tok, vocab, True, True, mass, BLOCK_V)
            else:
                if u < px / psum:
                    cur = i
                else:
                    mass = _residual(p_ptr, p_ptr, tok, vocab, False, False, 1.0, BLOCK_V)
                    if mass > 0:
                        psum = _residual(p_ptr, p_ptr, tok, vocab, False, True, mass, BLOCK_V)
            if cur == i:
                tl.debug_barrier()
                psum = _copy_row(target_ptr + (root_row + 1 + i) * vocab, p_ptr, vocab, BLOCK_V)
        i += 1
    tl.debug_barrier()
    # Bonus: inverse CDF of the residual, min(first j with cdf[j] > u * cdf[-1], last j with
    # p(j) > 0). Pass 1 finds cdf[-1] with the same blockwise scan as pass 2.
    total = psum * 0.0
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        cdf = total + tl.cumsum(tl.load(p_ptr + offs, mask=offs < vocab, other=0.0), axis=0)
        total = _last(cdf, BLOCK_V)
    threshold = tl.load(u_bonus_ptr + b) * total
    below = lo * 0
    last = lo * 0 - 1
    running = psum * 0.0
    for start in range(0, vocab, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        valid = offs < vocab
        p = tl.load(p_ptr + offs, mask=valid, other=0.0)
        cdf = running + tl.cumsum(p, axis=0)
        below += tl.sum(((cdf <= threshold) & valid).to(tl.int64), axis=0)
        last = tl.maximum(last, tl.max(tl.where(valid & (p > 0), offs, -1), axis=0))
        running = _last(cdf, BLOCK_V)
    last = tl.where(last < 0, vocab - 1, last)
    tl.store(num_accepted_ptr + b, tl.load(depth_ptr + lo + cur, mask=cur >= 0, other=0))
    tl.store(bonus_ptr + b, tl.minimum(below, last))
    _write_path(parent_ptr + lo, depth_ptr + lo, accepted_ptr + b * width, cur)
