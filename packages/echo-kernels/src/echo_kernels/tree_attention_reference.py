"""Pure-torch tree attention: the CPU serving path and the oracle of the Triton kernel.

One dense attention per request over exactly its own keys (cached prefix + new rows), in float32,
with the visibility of :mod:`echo_kernels.attention_metadata`; nothing is padded to the largest
request, so a zero-node request costs one query row. Grouped-query attention folds the query
heads that share a KV head into the query dimension instead of copying K/V. Plain matmul +
softmax rather than ``F.scaled_dot_product_attention``: on the 2-core CPU machines SDPA with
a boolean mask and these small shapes measured 10-100x slower (thread start-up dominates).
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.layouts import unpack_bits
from echo_kernels.attention_metadata import TreeAttentionMetadata


def visible_keys(meta: TreeAttentionMetadata, b: int, window: int | None) -> Tensor:
    """Visibility of request ``b``: [n_b, cache_len_b + n_b] bool, prefix columns first."""
    lo, hi = int(meta.cu_rows[b]), int(meta.cu_rows[b + 1])
    n, cached = hi - lo, int(meta.cache_len[b])
    dev = meta.device
    if bool(meta.causal[b]):
        tree = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
    else:
        tree = unpack_bits(meta.tree_bits[lo:hi], meta.tree_bits.shape[1] * 32)[:, :n]
    mask = torch.cat([torch.ones(n, cached, dtype=torch.bool, device=dev), tree], dim=1)
    if window is not None:
        q_pos = meta.positions[lo:hi]  # [n]
        k_pos = torch.cat([torch.arange(cached, device=dev), q_pos])  # [cached + n]
        mask &= (q_pos[:, None] - k_pos[None, :]) < window
    return mask


def tree_attention_reference(
    q: Tensor,  # [R, Hq, D] float, packed query rows
    k_new: Tensor,  # [R, Hkv, D] float, keys of the new rows
    v_new: Tensor,  # [R, Hkv, D] float, values of the new rows
    k_pool: Tensor,  # [num_slots, Hkv, D] float, cached keys
    v_pool: Tensor,  # [num_slots, Hkv, D] float, cached values
    meta: TreeAttentionMetadata,
    scale: float,
    window: int | None = None,
) -> Tensor:  # [R, Hq, D], q's dtype
    """Softmax attention of every row over its visible keys, accumulated in float32."""
    _, hq, d = q.shape
    hkv = k_new.shape[1]
    group = hq // hkv
    out = torch.empty_like(q)
    cu = meta.cu_rows.tolist()
    cache_len = meta.cache_len.tolist()
    for b in range(meta.batch_size):
        lo, hi = cu[b], cu[b + 1]
        n = hi - lo
        if n == 0:
            continue
        slots = meta.req_to_slot[b, : cache_len[b]]
        k = torch.cat([k_pool[slots], k_new[lo:hi]]).to(torch.float32).transpose(0, 1)
        v = torch.cat([v_pool[slots], v_new[lo:hi]]).to(torch.float32).transpose(0, 1)
        # [n, Hq, D] -> [Hkv, group * n, D]: query head h = kv_head * group + g.
        qb = q[lo:hi].to(torch.float32).view(n, hkv, group, d).permute(1, 2, 0, 3)
        qb = qb.reshape(hkv, group * n, d)
        mask = visible_keys(meta, b, window).repeat(group, 1)  # [group * n, keys]
        scores = torch.matmul(qb, k.transpose(1, 2)) * scale  # [Hkv, group * n, keys]
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        o = torch.matmul(weights, v)  # [Hkv, group * n, D]
        out[lo:hi] = o.view(hkv, group, n, d).permute(2, 0, 1, 3).reshape(n, hq, d).to(q.dtype)
    return out
