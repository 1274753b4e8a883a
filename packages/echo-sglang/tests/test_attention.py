"""Padded verify attention through SGLang's own Triton extend-attention kernel.

The padded path runs ``B T`` query rows with FULL_MASK blocks ``[T, p_b + T]`` through
``extend_attention_fwd`` (SGLang's Triton backend for target verify) with the prefix columns of
the mask honoured (``skip_prefix_custom_mask=False``, as FlashInfer's custom-mask prefill does);
on the real rows it must match echo-kernels' ragged tree attention (torch reference).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from echo_kernels.attention_metadata import verify_metadata
from echo_kernels.tree_attention import tree_attention
from echo_sglang.masks import TreeMaskMode
from echo_sglang.padded import padded_verify_input
from echo_sglang.synthetic import distinct_sibling_tree

from .conftest import SGLang

HEADS, KV_HEADS, DIM = 4, 2, 16
ATOL = 2e-5  # float32 (bf16 tl.dot is wrong in the Triton interpreter)


def _extend(
    sgl: SGLang, q: Tensor, k: Tensor, v: Tensor, pools: tuple[Tensor, Tensor],
    qo_indptr: Tensor, prefix: tuple[Tensor, Tensor], mask: Tensor, mask_indptr: Tensor,
    max_len: int,
) -> Tensor:  # fmt: skip
    out = torch.zeros_like(q)
    kv_indptr, kv_indices = prefix
    sgl.extend_attention(
        q, k, v, out, pools[0], pools[1], qo_indptr, kv_indptr, kv_indices, mask,
        False, mask_indptr, max_len, 1.0, 1.0, skip_prefix_custom_mask=False,
    )  # fmt: skip
    return out


@pytest.mark.parametrize("seed", range(3))
def test_padded_attention_agrees_with_tree_attention(sgl: SGLang, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    b, t = 3, 8
    tree = distinct_sibling_tree(gen, b, max_nodes=t - 1)
    seq_lens = torch.tensor([3, 0, 6])[:b]
    padded = padded_verify_input(tree, torch.arange(b), seq_lens, num_draft_tokens=t)
    q_len = padded.num_tokens.tolist()  # real rows per request: root + nodes
    rows = torch.tensor([r * t + j for r in range(b) for j in range(q_len[r])])

    # KV pool: request r's cached token j lives in slot req_to_slot[r, j] (shuffled).
    slots = torch.randperm(int(seq_lens.sum()) + 5, generator=gen)
    req_to_slot = torch.zeros(b, int(seq_lens.max()), dtype=torch.int64)
    kv_indptr = torch.zeros(b + 1, dtype=torch.int64)
    kv_indptr[1:] = torch.cumsum(seq_lens, 0)
    for r in range(b):
        req_to_slot[r, : int(seq_lens[r])] = slots[int(kv_indptr[r]) : int(kv_indptr[r + 1])]
    kv_indices = slots[: int(seq_lens.sum())]
    k_pool = torch.randn(slots.numel(), KV_HEADS, DIM, generator=gen)
    v_pool = torch.randn(slots.numel(), KV_HEADS, DIM, generator=gen)

    q = torch.randn(b * t, HEADS, DIM, generator=gen)  # padded rows; padding rows random too
    k = torch.randn(b * t, KV_HEADS, DIM, generator=gen)
    v = torch.randn(b * t, KV_HEADS, DIM, generator=gen)
    mask_padded = padded.custom_mask(TreeMaskMode.FULL_MASK)
    mask_indptr_padded = torch.zeros(b + 1, dtype=torch.int64)
    mask_indptr_padded[1:] = torch.cumsum(t * (seq_lens + t), 0)
    qo_padded = torch.arange(b + 1, dtype=torch.int64) * t
    out_padded = _extend(
        sgl, q, k, v, (k_pool, v_pool), qo_padded, (kv_indptr, kv_indices), mask_padded,
        mask_indptr_padded, t,
    )  # fmt: skip

    meta = verify_metadata(tree, seq_lens, req_to_slot)
    reference = tree_attention(
        q[rows], k[rows], v[rows], k_pool, v_pool, meta, scale=DIM**-0.5, backend="torch"
    )
    assert torch.allclose(out_padded[rows], reference, atol=ATOL)
