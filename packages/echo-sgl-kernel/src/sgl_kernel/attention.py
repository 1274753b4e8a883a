"""Shared pieces of the paged-KV attention ops: one request's softmax attention and the reads
of its keys and values out of the token-indexed KV pool.

For one request with queries q_m, keys k_n and values v_n (head by head)::

    s_mn = sm_scale * q_m . k_n
    s_mn = logit_cap * tanh(s_mn / logit_cap)          only when logit_cap > 0
    s_mn = -inf                                         where allowed[m, n] is False
    p_mn = exp(s_mn) / (sum_n' exp(s_mn') + exp(sink))  the sink term only with sinks
    o_m  = sum_n p_mn v_n

Query head h reads key/value head h // (Hq / Hkv) (grouped-query attention). Without a logit cap
or sinks the work goes to ``torch.nn.functional.scaled_dot_product_attention``, the kernel
SGLang's torch_native backend uses, so both backends agree closely; otherwise the formula above
runs as written, in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["attend", "gather_kv", "kv_span"]


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None,
    sm_scale: float,
    logit_cap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Attention of one request, per the module formula.

    q: [Hq, M, D]; k: [Hkv, N, D]; v: [Hkv, N, Dv], all in q's dtype; allowed: [M, N] bool or
    None (every key visible); sinks: [Hq] per-head sink logits or None. Returns [Hq, M, Dv] in
    q's dtype. Every query must see at least one key (or have a sink).
    """
    num_heads, num_kv_heads = q.shape[0], k.shape[0]
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} kv heads")
    if logit_cap <= 0 and sinks is None:
        out = F.scaled_dot_product_attention(
            q.unsqueeze(0),
            k.unsqueeze(0),
            v.unsqueeze(0),
            attn_mask=allowed,
            scale=sm_scale,
            enable_gqa=num_heads != num_kv_heads,
        )
        return out.squeeze(0)
    group = num_heads // num_kv_heads
    k32 = k.float().repeat_interleave(group, dim=0)
    v32 = v.float().repeat_interleave(group, dim=0)
    scores = torch.matmul(q.float(), k32.transpose(-1, -2)) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink_column = sinks.float().view(num_heads, 1, 1).expand(num_heads, scores.shape[1], 1)
        probs = torch.softmax(torch.cat((scores, sink_column), dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v32).to(q.dtype)


def gather_kv(
    buffer: torch.Tensor, slots: torch.Tensor, scale: float, dtype: torch.dtype
) -> torch.Tensor:
    """Rows ``slots`` of a KV pool buffer, as [heads, len(slots), dim] in ``dtype``.

    buffer: [pool_size, heads, dim]; slots: [n] int32/int64. A stored value x reads as
    x * scale (the per-layer scale of a quantised cache; 1.0 leaves values as stored).
    """
    rows = buffer.index_select(0, slots.long())
    if scale != 1.0:
        rows = rows.float() * scale
    return rows.to(dtype).transpose(0, 1)


def kv_span(
    index: int,
    seq_len: int,
    encoder_lens: torch.Tensor | None,
    is_cross_attention: bool,
) -> tuple[int, int]:
    """(start, length) of request ``index``'s keys in its req_to_token row.

    Encoder-decoder models keep the encoder tokens first: cross-attention reads those
    encoder_lens[index] slots, self-attention the seq_len slots after them. Without
    encoder_lens a request's keys are its first seq_len slots.
    """
    if encoder_lens is None:
        if is_cross_attention:
            raise ValueError("cross-attention needs encoder_lens")
        return 0, seq_len
    encoder_len = int(encoder_lens[index])
    if is_cross_attention:
        return 0, encoder_len
    return encoder_len, seq_len
