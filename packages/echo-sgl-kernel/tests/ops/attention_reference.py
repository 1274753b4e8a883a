"""A dense float64 attention reference and a random paged KV pool for the attention op tests.

The reference is the textbook formula, head by head, with an explicit [M, N] visibility mask:
s = sm_scale q.k (then cap * tanh(s / cap) when capped), masked keys dropped, p = exp(s) /
(sum exp(s) + exp(sink)), out = sum p v. Query head h reads kv head h // (Hq / Hkv).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def reference_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    visible: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [M, Hq, D]; keys: [N, Hkv, D]; values: [N, Hkv, Dv]; visible: [M, N] bool.

    Returns [M, Hq, Dv] float64.
    """
    num_heads, num_kv_heads = q.shape[1], keys.shape[1]
    group = num_heads // num_kv_heads
    out = torch.zeros(q.shape[0], num_heads, values.shape[-1], dtype=torch.float64)
    for h in range(num_heads):
        kv = h // group
        s = (q[:, h].double() @ keys[:, kv].double().t()) * sm_scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        s = s.masked_fill(~visible, float("-inf"))
        top = s.max(dim=-1, keepdim=True).values
        if sinks is not None:
            top = torch.maximum(top, torch.full_like(top, float(sinks[h])))
        e = torch.exp(s - top)
        denom = e.sum(dim=-1, keepdim=True)
        if sinks is not None:
            denom = denom + torch.exp(float(sinks[h]) - top)
        out[:, h] = (e / denom) @ values[:, kv].double()
    return out


def attention_scale(values: torch.Tensor) -> float:
    """The magnitude of an attention output's reduced terms: p_n v_n with sum p_n = 1, so at
    most max |v| (the tolerance scale of every attention comparison)."""
    return float(values.double().abs().max()) if values.numel() else 0.0


@dataclass(frozen=True, slots=True)
class PagedPool:
    """A token-indexed KV pool and its request table, filled with random values."""

    k_buffer: torch.Tensor  # [pool, Hkv, D]
    v_buffer: torch.Tensor  # [pool, Hkv, Dv]
    req_to_token: torch.Tensor  # [max_reqs, max_context] int32
    req_pool_indices: torch.Tensor  # [B] int64

    def slots(self, request: int, start: int, stop: int) -> torch.Tensor:
        """Pool slots of request ``request``'s tokens start ... stop - 1, int64."""
        row = int(self.req_pool_indices[request])
        return self.req_to_token[row, start:stop].long()


def make_pool(
    lengths: list[int],
    num_kv_heads: int,
    head_dim: int,
    v_head_dim: int,
    dtype: torch.dtype,
    seed: int,
) -> PagedPool:
    """Request i owns lengths[i] distinct random slots (slot 0 stays unused, as in SGLang)."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    pool_size = total + 9
    max_context = max(lengths, default=0) + 5
    max_reqs = len(lengths) + 3
    k_buffer = torch.randn(pool_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_buffer = torch.randn(pool_size, num_kv_heads, v_head_dim, generator=gen).to(dtype)
    req_to_token = torch.zeros(max_reqs, max_context, dtype=torch.int32)
    rows = torch.randperm(max_reqs, generator=gen)[: len(lengths)]
    slots = torch.randperm(pool_size - 1, generator=gen)[:total] + 1
    offset = 0
    for row, length in zip(rows.tolist(), lengths, strict=True):
        req_to_token[row, :length] = slots[offset : offset + length].to(torch.int32)
        offset += length
    return PagedPool(k_buffer, v_buffer, req_to_token, rows.long())
