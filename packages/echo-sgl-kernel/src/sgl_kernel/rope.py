"""Rotary position embedding from a packed cos/sin cache.

``cos_sin_cache`` is ``[max_position, rotary_dim]``: row p holds cos(p * f_i) in its first
rotary_dim / 2 columns and sin(p * f_i) in the rest. Within each head the first ``rotary_dim``
dims are rotated and the remaining ``head_size - rotary_dim`` pass through unchanged. Pairs are
(x[i], x[i + rotary_dim / 2]) in NeoX style and (x[2i], x[2i + 1]) in GPT-J style; each pair
(a, b) at position p becomes (a cos - b sin, b cos + a sin).

``apply_rotary_pos_emb_cpu`` is the Hugging Face form of the NeoX rotation, with per-token
cos/sin rows already gathered and spanning the whole head: x cos + rotate_half(x) sin.
"""

from __future__ import annotations

import torch

from sgl_kernel.library import register

__all__ = ["apply_rotary", "apply_rotary_pos_emb_cpu", "rotary_embedding_cpu"]


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool
) -> torch.Tensor:
    """Rotate the first 2 * cos.shape[-1] dims of each head of ``x``.

    x: [tokens, heads, head_size]; cos, sin: [tokens, rotary_dim / 2]. Computed in float32 and
    rounded to ``x.dtype`` once; returns a new tensor shaped like ``x``.
    """
    half = cos.shape[-1]
    rotary_dim = 2 * half
    x32 = x.float()
    rot = x32[..., :rotary_dim]
    c = cos.float().unsqueeze(-2)
    s = sin.float().unsqueeze(-2)
    if is_neox:
        a, b = rot[..., :half], rot[..., half:]
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
    out_a = a * c - b * s
    out_b = b * c + a * s
    if is_neox:
        rotated = torch.cat((out_a, out_b), dim=-1)
    else:
        rotated = torch.stack((out_a, out_b), dim=-1).flatten(-2)
    return torch.cat((rotated, x32[..., rotary_dim:]), dim=-1).to(x.dtype)


def _as_heads(t: torch.Tensor, rows: int, head_size: int, name: str) -> torch.Tensor:
    """View a 2-D [T, H * D], 3-D [T, H, D] or 4-D [B, S, H, D] tensor as [rows, H, D]."""
    if t.dim() == 2:
        if t.shape[1] % head_size != 0:
            raise ValueError(
                f"{name} last dim {t.shape[1]} is not a multiple of head_size {head_size}"
            )
        heads = t.reshape(t.shape[0], t.shape[1] // head_size, head_size)
    elif t.dim() in (3, 4):
        heads = t.reshape(-1, t.shape[-2], t.shape[-1])
    else:
        raise ValueError(f"{name} must be 2-D, 3-D or 4-D, got shape {tuple(t.shape)}")
    if heads.shape[0] != rows or heads.shape[-1] != head_size:
        raise ValueError(
            f"{name} of shape {tuple(t.shape)} does not hold {rows} rows of heads of size "
            f"{head_size}"
        )
    return heads


def rotary_embedding_cpu(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query`` and ``key`` at ``positions``; returns new tensors shaped like the inputs.

    positions: [T] int64 (T = B * S for 4-D inputs); query: [T, Hq * D], [T, Hq, D] or
    [B, S, Hq, D]; key: the same layout with Hkv heads; cos_sin_cache: [max_position,
    rotary_dim], rotary_dim <= head_size and even. The inputs are left unchanged.
    """
    if positions.dim() != 1:
        raise ValueError(f"positions must be 1-D, got shape {tuple(positions.shape)}")
    if cos_sin_cache.dim() != 2:
        raise ValueError(f"cos_sin_cache must be 2-D, got shape {tuple(cos_sin_cache.shape)}")
    rotary_dim = cos_sin_cache.shape[1]
    if rotary_dim % 2 != 0 or rotary_dim > head_size:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and <= head_size {head_size}")
    rows = positions.shape[0]
    q = _as_heads(query, rows, head_size, "query")
    k = _as_heads(key, rows, head_size, "key")
    cos_sin = cos_sin_cache.index_select(0, positions.long())
    cos, sin = cos_sin[:, : rotary_dim // 2], cos_sin[:, rotary_dim // 2 :]
    q_out = apply_rotary(q, cos, sin, is_neox).reshape(query.shape)
    k_out = apply_rotary(k, cos, sin, is_neox).reshape(key.shape)
    return q_out, k_out


def _rotate_half_embed(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x cos + rotate_half(x) sin in float32, rotate_half([a, b]) = [-b, a]; rounded once."""
    x32 = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    c = cos.float().unsqueeze(-2)
    s = sin.float().unsqueeze(-2)
    return (x32 * c + rotated * s).to(x.dtype)


def apply_rotary_pos_emb_cpu(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF-style rotary embedding; returns new tensors shaped like the inputs.

    query: [T, Hq, D]; key: [T, Hkv, D]; cos, sin: [T, D] rows for each token's position, with
    cos[:, i] = cos[:, i + D/2] (the HF layout). out = x * cos + rotate_half(x) * sin per head.
    """
    if query.dim() != 3 or key.dim() != 3:
        raise ValueError(
            f"query [T, Hq, D] and key [T, Hkv, D] expected, got {tuple(query.shape)} and "
            f"{tuple(key.shape)}"
        )
    expected = (query.shape[0], query.shape[-1])
    if cos.shape != expected or sin.shape != expected or key.shape[::2] != query.shape[::2]:
        raise ValueError(
            f"cos and sin must be {expected} and key [T, Hkv, D] match query, got cos "
            f"{tuple(cos.shape)}, sin {tuple(sin.shape)}, key {tuple(key.shape)}"
        )
    if query.shape[-1] % 2 != 0:
        raise ValueError(f"head size {query.shape[-1]} must be even")
    return _rotate_half_embed(query, cos, sin), _rotate_half_embed(key, cos, sin)


register(
    "apply_rotary_pos_emb_cpu(Tensor query, Tensor key, Tensor cos, Tensor sin) "
    "-> (Tensor, Tensor)",
    apply_rotary_pos_emb_cpu,
)
register(
    "rotary_embedding_cpu(Tensor positions, Tensor query, Tensor key, int head_size, "
    "Tensor cos_sin_cache, bool is_neox) -> (Tensor, Tensor)",
    rotary_embedding_cpu,
)
