"""Variable-length (packed) attention without a KV pool: ``flash_attn_varlen_func``.

SGLang's CPU vision encoders (``VisionAMXAttention``) call it; ``sglang.srt.layers.attention
.vision`` looks the op up when it is imported, which the server does on every model. Sequence i
owns query rows cu_seqlens_q[i] ... cu_seqlens_q[i + 1] and key rows cu_seqlens_k[i] ...
cu_seqlens_k[i + 1]; it attends only to its own keys with the softmax of
:mod:`sgl_kernel.attention` (scale 1 / sqrt(D) unless given). With ``causal`` the mask is
aligned to the bottom right, as in flash-attn: for Lq queries and Lk keys, query j sees key n
when n <= j + Lk - Lq.
"""

from __future__ import annotations

import math

import torch

from sgl_kernel.attention import attend
from sgl_kernel.library import register

__all__ = ["flash_attn_varlen_func"]


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Packed attention; returns [total_q, Hq, Dv] in q's dtype.

    q: [total_q, Hq, D]; k: [total_k, Hkv, D]; v: [total_k, Hkv, Dv]; cu_seqlens_q/k: [B + 1]
    cumulative lengths starting at 0. max_seqlen_q/k are the compiled kernel's buffer bounds,
    checked here against the actual lengths.
    """
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(
            f"q, k, v must be [tokens, heads, dim], got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    q_bounds = [int(x) for x in cu_seqlens_q.tolist()]
    k_bounds = [int(x) for x in cu_seqlens_k.tolist()]
    if len(q_bounds) != len(k_bounds) or q_bounds[-1] != q.shape[0] or k_bounds[-1] != k.shape[0]:
        raise ValueError(
            f"cu_seqlens_q {q_bounds} / cu_seqlens_k {k_bounds} do not describe "
            f"{q.shape[0]} query and {k.shape[0]} key rows"
        )
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[-1]))
    for i in range(len(q_bounds) - 1):
        q0, q1, k0, k1 = q_bounds[i], q_bounds[i + 1], k_bounds[i], k_bounds[i + 1]
        if q1 - q0 > max_seqlen_q or k1 - k0 > max_seqlen_k:
            raise ValueError(
                f"sequence {i} has {q1 - q0} queries / {k1 - k0} keys, over max_seqlen_q "
                f"{max_seqlen_q} / max_seqlen_k {max_seqlen_k}"
            )
        if q1 == q0:
            continue
        allowed = None
        if causal:
            rows = torch.arange(q1 - q0).unsqueeze(1)
            cols = torch.arange(k1 - k0).unsqueeze(0)
            allowed = cols <= rows + (k1 - k0) - (q1 - q0)
        seq_out = attend(
            q[q0:q1].transpose(0, 1),
            k[k0:k1].transpose(0, 1),
            v[k0:k1].transpose(0, 1),
            allowed,
            scale,
            0.0,
            None,
        )
        out[q0:q1] = seq_out.transpose(0, 1)
    return out


register(
    "flash_attn_varlen_func(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
    "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, bool causal=False, "
    "float? softmax_scale=None) -> Tensor",
    flash_attn_varlen_func,
)
