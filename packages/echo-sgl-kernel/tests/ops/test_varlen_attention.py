"""flash_attn_varlen_func (packed sequences, no KV pool) against the dense float64 reference."""

from __future__ import annotations

import pytest
import torch

import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel)

from .attention_reference import attention_scale, reference_attention
from .tolerance import assert_close

OPS = torch.ops.sgl_kernel
DTYPES = [torch.float32, torch.bfloat16]
HQ, HKV, D = 4, 2, 40


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_attention_keeps_sequences_apart(dtype: torch.dtype, causal: bool) -> None:
    q_lens, k_lens = [3, 1, 6], [5, 1, 6]  # causal masks align to the bottom right
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(sum(q_lens), HQ, D, generator=gen).to(dtype)
    k = torch.randn(sum(k_lens), HKV, D, generator=gen).to(dtype)
    v = torch.randn(sum(k_lens), HKV, D, generator=gen).to(dtype)
    cu_q = torch.tensor([0, 3, 4, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 6, 12], dtype=torch.int32)
    out = OPS.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=6, max_seqlen_k=6, causal=causal
    )
    for i in range(3):
        q0, k0, lq, lk = int(cu_q[i]), int(cu_k[i]), q_lens[i], k_lens[i]
        visible = torch.tensor(
            [[not causal or n <= j + lk - lq for n in range(lk)] for j in range(lq)]
        )
        values = v[k0 : k0 + lk]
        ref = reference_attention(q[q0 : q0 + lq], k[k0 : k0 + lk], values, visible, D**-0.5)
        assert_close(out[q0 : q0 + lq], ref, dtype, max(D, lk), scale=attention_scale(values))


def test_varlen_attention_rejects_lengths_over_the_bound() -> None:
    q = torch.randn(4, HQ, D)
    k = torch.randn(4, HKV, D)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="max_seqlen"):
        OPS.flash_attn_varlen_func(q, k, k, cu, cu, 3, 4)
