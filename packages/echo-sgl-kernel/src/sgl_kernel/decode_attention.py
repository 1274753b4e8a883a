"""Decode attention over a paged KV pool: one new query token per request.

The op first stores the new token's key/value at ``loc`` (when given: the intel_amx backend
leaves that write to the kernel), then request b's query attends to the keys in slots
``req_to_token[req_pool_indices[b], start : start + seq_lens[b]]`` (see
:func:`sgl_kernel.attention.kv_span` for ``start``), with the softmax of
:mod:`sgl_kernel.attention`. With a sliding window of W > 0 tokens only the last W keys count.
"""

from __future__ import annotations

import torch

from sgl_kernel.attention import attend, gather_kv, kv_span
from sgl_kernel.library import register

__all__ = ["decode_attention_cpu"]


def _check(
    query: torch.Tensor,
    output: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    if query.dim() != 3 or output.dim() != 3 or output.shape[:2] != query.shape[:2]:
        raise ValueError(
            f"query [B, Hq, D] and output [B, Hq, Dv] expected, got {tuple(query.shape)} and "
            f"{tuple(output.shape)}"
        )
    if k_cache.dim() != 3 or v_cache.dim() != 3 or k_cache.shape[-1] != query.shape[-1]:
        raise ValueError(
            f"k_cache [pool, Hkv, D] and v_cache [pool, Hkv, Dv] expected for D = "
            f"{query.shape[-1]}, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if v_cache.shape[-1] != output.shape[-1]:
        raise ValueError(f"v_cache dim {v_cache.shape[-1]} != output dim {output.shape[-1]}")
    batch = query.shape[0]
    if seq_lens.shape != (batch,) or req_pool_indices.shape != (batch,):
        raise ValueError(
            f"seq_lens and req_pool_indices must be [{batch}], got {tuple(seq_lens.shape)} "
            f"and {tuple(req_pool_indices.shape)}"
        )


def decode_attention_cpu(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: float,
    v_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor | None,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """Write ``output`` [B, Hq, Dv] in place; also write key/value into the caches at ``loc``.

    query: [B, Hq, D]; k_cache/v_cache: [pool, Hkv, D/Dv]; key/value: [B, Hkv, D/Dv] or None
    (already stored); loc: [B] slots for key/value; attn_logits: the compiled kernel's split-KV
    scratch [B, Hq, splits, Dv + 1], neither read nor written here; req_to_token:
    [max_reqs, max_context] int32/int64; req_pool_indices: [B]; seq_lens: [B] key counts
    including the new token; k_scale/v_scale: cache read scales (x_read = x_stored * scale);
    sliding_window_size: visible keys W, or <= 0 for no window (SGLang passes window + 1);
    sinks: [Hq] sink logits or None.
    """
    _check(query, output, k_cache, v_cache, req_pool_indices, seq_lens)
    if (key is None) != (value is None):
        raise ValueError("key and value must be given together")
    if key is not None and value is not None:
        if loc is None or loc.shape != (query.shape[0],):
            raise ValueError(f"loc must be [{query.shape[0]}] when key/value are given")
        k_cache.index_copy_(0, loc.long(), key.to(k_cache.dtype))
        v_cache.index_copy_(0, loc.long(), value.to(v_cache.dtype))
    lens = [int(n) for n in seq_lens.tolist()]
    rows = [int(r) for r in req_pool_indices.tolist()]
    for b, (seq_len, row) in enumerate(zip(lens, rows, strict=True)):
        start, length = kv_span(b, seq_len, encoder_lens, is_cross_attention)
        if length <= 0:
            continue
        if sliding_window_size > 0 and not is_cross_attention and length > sliding_window_size:
            start, length = start + length - sliding_window_size, sliding_window_size
        slots = req_to_token[row, start : start + length]
        k = gather_kv(k_cache, slots, k_scale, query.dtype)
        v = gather_kv(v_cache, slots, v_scale, query.dtype)
        out = attend(query[b].unsqueeze(1), k, v, None, sm_scale, logit_cap, sinks)
        output[b].copy_(out.squeeze(1))


register(
    "decode_attention_cpu(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float k_scale, "
    "float v_scale, Tensor(c!) output, Tensor? key, Tensor? value, Tensor? loc, "
    "Tensor attn_logits, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
    "float sm_scale, float logit_cap, bool is_cross_attention, int sliding_window_size, "
    "Tensor? encoder_lens, Tensor? sinks) -> ()",
    decode_attention_cpu,
)
