"""Rotary embeddings against the rotation written out per pair in float64."""

from __future__ import annotations

import pytest
import torch

import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel)

from .tolerance import assert_close

OPS = torch.ops.sgl_kernel
DTYPES = [torch.float32, torch.bfloat16]
BASE = 10000.0
MAX_POS = 97


def _angles(rotary_dim: int) -> torch.Tensor:
    """[MAX_POS, rotary_dim / 2] float64: p * base^(-2i / rotary_dim)."""
    inv_freq = BASE ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    return torch.arange(MAX_POS, dtype=torch.float64).unsqueeze(1) * inv_freq


def _cache(rotary_dim: int, dtype: torch.dtype) -> torch.Tensor:
    angles = _angles(rotary_dim)
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype)


def _rotate_reference(
    x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, is_neox: bool, cache: torch.Tensor
) -> torch.Tensor:
    """x: [T, H, D]; rotates each pair by its angle, pair by pair, in float64."""
    half = rotary_dim // 2
    cos = cache.double()[positions][:, :half]
    sin = cache.double()[positions][:, half:]
    out = x.double().clone()
    for i in range(half):
        a_idx, b_idx = (i, i + half) if is_neox else (2 * i, 2 * i + 1)
        a, b = x.double()[..., a_idx], x.double()[..., b_idx]
        c, s = cos[:, i].unsqueeze(1), sin[:, i].unsqueeze(1)
        out[..., a_idx] = a * c - b * s
        out[..., b_idx] = b * c + a * s
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("layout", ["2d", "3d", "4d"])
@pytest.mark.parametrize(("head_size", "rotary_dim"), [(64, 64), (24, 16)])
def test_rotary_embedding_rotates_pairs(
    dtype: torch.dtype, is_neox: bool, layout: str, head_size: int, rotary_dim: int
) -> None:
    gen = torch.Generator().manual_seed(head_size + rotary_dim)
    tokens, hq, hkv = 6, 5, 3
    q = torch.randn(tokens, hq, head_size, generator=gen).to(dtype)
    k = torch.randn(tokens, hkv, head_size, generator=gen).to(dtype)
    positions = torch.randint(0, MAX_POS, (tokens,), generator=gen)
    cache = _cache(rotary_dim, dtype)
    shapes = {
        "2d": ((tokens, hq * head_size), (tokens, hkv * head_size)),
        "3d": ((tokens, hq, head_size), (tokens, hkv, head_size)),
        "4d": ((2, 3, hq, head_size), (2, 3, hkv, head_size)),
    }[layout]
    q_in, k_in = q.reshape(shapes[0]), k.reshape(shapes[1])
    q_before, k_before = q_in.clone(), k_in.clone()
    q_out, k_out = OPS.rotary_embedding_cpu(positions, q_in, k_in, head_size, cache, is_neox)
    assert q_out.shape == q_in.shape
    assert k_out.shape == k_in.shape
    assert torch.equal(q_in, q_before)
    assert torch.equal(k_in, k_before)
    # a rotation of values of order one: one product pair per output, rounded once
    q_ref = _rotate_reference(q, positions, rotary_dim, is_neox, cache)
    k_ref = _rotate_reference(k, positions, rotary_dim, is_neox, cache)
    assert_close(q_out.reshape(q.shape), q_ref, dtype, 2)
    assert_close(k_out.reshape(k.shape), k_ref, dtype, 2)


def test_rotary_embedding_at_position_zero_is_the_identity() -> None:
    q = torch.randn(1, 2, 8)
    q_out, _ = OPS.rotary_embedding_cpu(
        torch.zeros(1, dtype=torch.long), q, q.clone(), 8, _cache(8, torch.float32), True
    )
    assert torch.equal(q_out, q)


def test_rotary_embedding_rejects_a_rotary_dim_over_the_head_size() -> None:
    q = torch.randn(2, 8)
    with pytest.raises(ValueError, match="rotary_dim"):
        OPS.rotary_embedding_cpu(
            torch.zeros(2, dtype=torch.long), q, q, 8, _cache(16, torch.float32), True
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_apply_rotary_pos_emb_is_the_rotate_half_form(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    tokens, head_size = 5, 12
    q = torch.randn(tokens, 4, head_size, generator=gen).to(dtype)
    k = torch.randn(tokens, 2, head_size, generator=gen).to(dtype)
    positions = torch.randint(0, MAX_POS, (tokens,), generator=gen)
    angles = _angles(head_size)[positions]
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(dtype)
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1).to(dtype)
    q_out, k_out = OPS.apply_rotary_pos_emb_cpu(q, k, cos, sin)
    # the HF form with full-width cos/sin is the NeoX pair rotation
    cache = torch.cat((cos[:, : head_size // 2], sin[:, : head_size // 2]), dim=-1)
    index = torch.arange(tokens)
    assert_close(q_out, _rotate_reference(q, index, head_size, True, cache), dtype, 2)
    assert_close(k_out, _rotate_reference(k, index, head_size, True, cache), dtype, 2)
