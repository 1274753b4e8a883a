"""echo-kernels' ``tree_attention`` behind the model's :class:`AttentionBackend` seam.

``plan`` converts an :class:`AttentionBatch` into echo-kernels' ``TreeAttentionMetadata``:
the batch's rows of the pool's slot table become ``req_to_slot`` ([B, max cached] int64), the
boolean new-row mask becomes bit-packed ``tree_bits`` (echo_core ``pack_bits``) and ``causal``
marks requests without a mask. ``attend`` calls ``echo_kernels.tree_attention``: the Triton
kernel on CUDA, echo-kernels' torch reference on CPU (``backend="auto"``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.layouts import pack_bits
from echo_kernels import Backend, TreeAttentionMetadata, tree_attention
from echo_server.model.attention import AttentionBatch, ragged_positions


class KernelsAttention:
    """Attention backend running echo-kernels' ragged tree attention."""

    def __init__(self, backend: Backend = "auto") -> None:
        self.backend: Backend = backend

    def plan(self, batch: AttentionBatch) -> TreeAttentionMetadata:
        dev = batch.cu_rows.device
        width = max(max(batch.cache_len_host, default=0), 1)
        req_to_slot = batch.slot_table[batch.req_rows, :width].contiguous()  # [B, width]
        if batch.new_mask is None:
            bits = torch.zeros(batch.num_rows, 0, dtype=torch.int32, device=dev)
            causal = torch.ones(batch.batch_size, dtype=torch.bool, device=dev)
        else:
            bits = pack_bits(batch.new_mask)
            causal = torch.zeros(batch.batch_size, dtype=torch.bool, device=dev)
        meta = TreeAttentionMetadata(
            cu_rows=batch.cu_rows,
            positions=ragged_positions(batch),  # only read for sliding windows (unused here)
            cache_len=batch.cache_len,
            req_to_slot=req_to_slot,
            tree_bits=bits,
            causal=causal,
            max_rows=batch.max_rows,
        )
        meta.validate()
        return meta

    def attend(
        self,
        plan: TreeAttentionMetadata,
        q: Tensor,  # [R, H, D]
        k_new: Tensor,  # [R, Hkv, D]
        v_new: Tensor,  # [R, Hkv, D]
        k_cache: Tensor,  # [S, Hkv, D]
        v_cache: Tensor,  # [S, Hkv, D]
        scale: float,
    ) -> Tensor:
        return tree_attention(
            q.contiguous(),
            k_new.contiguous(),
            v_new.contiguous(),
            k_cache,
            v_cache,
            plan,
            scale=scale,
            backend=self.backend,
        )
