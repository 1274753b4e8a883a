"""Extend (prefill) attention over a paged KV pool, with an optional speculative tree mask.

Request i has seq_lens[i] keys, of which the last e_i = extend_seq_lens[i] are new: its queries
are rows extend_start_loc[i] ... + e_i of ``q_extend``, and so are its new keys in ``k_extend``
(when given). The p_i = seq_lens[i] - e_i prefix keys come from the pool through
``req_to_token``. Query j (position p_i + j) may see key n (position n) when:

    n < p_i                       always (the committed prefix), and otherwise
    tree_mask[i][j, n - p_i]      with a tree mask (speculative verify),
    n <= p_i + j                  without one, when is_causal,
    true                          without one, when not is_causal;
    and, with a sliding window of W > 0 tokens, p_i + j - n < W.

The tree mask is flat bool, one block per request in request order: either [e_i, e_i] over the
new tokens only (SGLang's QLEN_ONLY mode, what its CPU path builds) or [e_i, seq_lens[i]] over
every key (FULL_MASK mode); its length tells the two apart. The attention itself is the formula
of :mod:`sgl_kernel.attention`.
"""

from __future__ import annotations

import torch

from sgl_kernel.attention import attend, gather_kv, kv_span
from sgl_kernel.library import register

__all__ = ["extend_attention_cpu", "tree_mask_blocks"]


def tree_mask_blocks(
    tree_mask: torch.Tensor, extend_lens: list[int], seq_lens: list[int]
) -> list[torch.Tensor]:
    """Split a flat tree mask into per-request [e_i, seq_lens[i]] bool blocks (prefix included).

    A QLEN_ONLY mask (length sum e_i^2) gets its prefix columns filled with True; a FULL_MASK
    mask (length sum e_i * seq_lens[i]) is used as is. Example: e = [2], seq_lens = [5] and the
    QLEN_ONLY mask [1, 0, 1, 1] give [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]].
    """
    flat = tree_mask.reshape(-1).bool()
    qlen_total = sum(e * e for e in extend_lens)
    full_total = sum(e * s for e, s in zip(extend_lens, seq_lens, strict=True))
    if flat.numel() not in (qlen_total, full_total):
        raise ValueError(
            f"tree_mask has {flat.numel()} entries; a QLEN_ONLY mask needs {qlen_total} and "
            f"a FULL_MASK one {full_total} for extend_seq_lens {extend_lens}"
        )
    qlen_only = flat.numel() == qlen_total
    blocks: list[torch.Tensor] = []
    offset = 0
    for e, s in zip(extend_lens, seq_lens, strict=True):
        width = e if qlen_only else s
        block = flat[offset : offset + e * width].view(e, width)
        offset += e * width
        if qlen_only:
            prefix = torch.ones((e, s - e), dtype=torch.bool, device=flat.device)
            block = torch.cat((prefix, block), dim=1)
        blocks.append(block)
    return blocks


def _visibility(
    prefix_len: int,
    extend_len: int,
    tree_block: torch.Tensor | None,
    is_causal: bool,
    sliding_window_size: int,
) -> torch.Tensor | None:
    """The [e, p + e] allowed-key mask of the module docstring, or None when all keys are seen."""
    q_pos = torch.arange(prefix_len, prefix_len + extend_len).unsqueeze(1)
    k_pos = torch.arange(prefix_len + extend_len).unsqueeze(0)
    allowed: torch.Tensor | None
    if tree_block is not None:
        allowed = tree_block
    elif is_causal:
        allowed = k_pos <= q_pos
    else:
        allowed = None
    if sliding_window_size > 0:
        in_window = (q_pos - k_pos) < sliding_window_size
        allowed = in_window if allowed is None else allowed & in_window
    return allowed


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Write ``o_extend`` [T, Hq, Dv] in place; the pool buffers are only read.

    q_extend: [T, Hq, D]; k_extend/v_extend: [T, Hkv, D/Dv] or None (then the new keys are read
    from the pool, where the caller stored them); k_buffer/v_buffer: [pool, Hkv, D/Dv] (prefix
    values read as stored * k_scale / v_scale); req_to_token: [max_reqs, max_context];
    req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc: [B]; max_len_extend: the
    compiled kernel's buffer bound, unused; sliding_window_size: visible keys W, <= 0 for none;
    tree_mask: flat bool or None; sinks: [Hq] or None. Cross-attention (keys = the encoder
    tokens, none of them new) sees every key.
    """
    if q_extend.dim() != 3 or o_extend.dim() != 3 or o_extend.shape[:2] != q_extend.shape[:2]:
        raise ValueError(
            f"q_extend [T, Hq, D] and o_extend [T, Hq, Dv] expected, got "
            f"{tuple(q_extend.shape)} and {tuple(o_extend.shape)}"
        )
    if (k_extend is None) != (v_extend is None):
        raise ValueError("k_extend and v_extend must be given together")
    batch = seq_lens.shape[0]
    for name, t in (("req_pool_indices", req_pool_indices), ("extend_seq_lens", extend_seq_lens)):
        if t.shape != (batch,):
            raise ValueError(f"{name} must be [{batch}], got {tuple(t.shape)}")
    lens = [int(n) for n in seq_lens.tolist()]
    extend_lens = [int(n) for n in extend_seq_lens.tolist()]
    starts = [int(n) for n in extend_start_loc.tolist()]
    rows = [int(r) for r in req_pool_indices.tolist()]
    blocks = None if tree_mask is None else tree_mask_blocks(tree_mask, extend_lens, lens)
    dtype = q_extend.dtype
    for i in range(batch):
        e, q0 = extend_lens[i], starts[i]
        if e == 0:
            continue
        if e > lens[i] or q0 < 0 or q0 + e > q_extend.shape[0]:
            raise ValueError(
                f"request {i}: extend length {e} at {q0} does not fit seq_len {lens[i]} and "
                f"{q_extend.shape[0]} query rows"
            )
        q = q_extend[q0 : q0 + e].transpose(0, 1)
        kv_start, kv_len = kv_span(i, lens[i], encoder_lens, is_cross_attention)
        slots = req_to_token[rows[i], kv_start : kv_start + kv_len]
        if is_cross_attention:
            k = gather_kv(k_buffer, slots, k_scale, dtype)
            v = gather_kv(v_buffer, slots, v_scale, dtype)
            allowed = None
        else:
            prefix = kv_len - e
            if k_extend is not None and v_extend is not None:
                k_new = k_extend[q0 : q0 + e].to(dtype).transpose(0, 1)
                v_new = v_extend[q0 : q0 + e].to(dtype).transpose(0, 1)
            else:
                k_new = gather_kv(k_buffer, slots[prefix:], k_scale, dtype)
                v_new = gather_kv(v_buffer, slots[prefix:], v_scale, dtype)
            k_old = gather_kv(k_buffer, slots[:prefix], k_scale, dtype)
            v_old = gather_kv(v_buffer, slots[:prefix], v_scale, dtype)
            k = torch.cat((k_old, k_new), dim=1)
            v = torch.cat((v_old, v_new), dim=1)
            block = None if blocks is None else blocks[i]
            allowed = _visibility(prefix, e, block, is_causal, sliding_window_size)
        out = attend(q, k, v, allowed, sm_scale, logit_cap, sinks)
        o_extend[q0 : q0 + e].copy_(out.transpose(0, 1))


register(
    "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, "
    "Tensor(a!) o_extend, Tensor k_buffer, Tensor v_buffer, float k_scale, float v_scale, "
    "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, "
    "Tensor extend_start_loc, int max_len_extend, float sm_scale, float logit_cap, "
    "bool is_cross_attention, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks, "
    "Tensor? tree_mask, bool is_causal) -> ()",
    extend_attention_cpu,
)
