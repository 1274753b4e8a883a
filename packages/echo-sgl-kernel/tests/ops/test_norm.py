"""RMSNorm / LayerNorm ops against float64 formulas, in float32 and bfloat16, on odd shapes."""

from __future__ import annotations

import pytest
import torch

import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel)

from .tolerance import assert_close

OPS = torch.ops.sgl_kernel
DTYPES = [torch.float32, torch.bfloat16]
SHAPES = [(1, 7), (5, 257), (3, 4, 96)]
EPS = 1e-6


def _inputs(
    shape: tuple[int, ...], dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    w = (torch.rand(shape[-1], generator=gen) + 0.5).to(dtype)
    return x, w


def _rms64(x: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rmsnorm_matches_formula(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x, w = _inputs(shape, dtype, 0)
    out = OPS.rmsnorm_cpu(x, w, EPS)
    assert out.dtype == dtype
    assert out.shape == x.shape
    assert_close(out, _rms64(x, EPS) * w.double(), dtype, shape[-1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_gemma_rmsnorms_scale_by_one_plus_weight(
    dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    x, w = _inputs(shape, dtype, 1)
    expected = _rms64(x, EPS) * (1.0 + w.double())
    assert_close(OPS.gemma_rmsnorm_cpu(x, w, EPS), expected, dtype, shape[-1])
    assert_close(OPS.gemma3_rmsnorm_cpu(x, w, EPS), expected, dtype, shape[-1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_scale", [True, False])
def test_gemma4_rmsnorm_shifts_the_weight(dtype: torch.dtype, with_scale: bool) -> None:
    x, w = _inputs((4, 33), dtype, 2)
    out = OPS.gemma4_rmsnorm_cpu(x, w, EPS, 0.5, with_scale)
    expected = _rms64(x, EPS) * ((w.double() + 0.5) if with_scale else 1.0)
    assert_close(out, expected, dtype, 33)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", ["fused_add_rmsnorm_cpu", "gemma_fused_add_rmsnorm_cpu"])
def test_fused_add_rmsnorm_updates_both_in_place(
    dtype: torch.dtype, shape: tuple[int, ...], op: str
) -> None:
    x, w = _inputs(shape, dtype, 3)
    r = _inputs(shape, dtype, 4)[0]
    x_in, r_in = x.clone(), r.clone()
    result = getattr(OPS, op)(x, r, w, EPS)
    assert result is None
    summed = x_in.double() + r_in.double()
    scale = w.double() if op == "fused_add_rmsnorm_cpu" else 1.0 + w.double()
    # residual holds the sum rounded once; input the norm of the unrounded sum
    assert_close(r, summed, dtype, 1)
    assert_close(x, _rms64(summed, EPS) * scale, dtype, shape[-1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_layernorm_matches_formula(dtype: torch.dtype, with_bias: bool) -> None:
    x, w = _inputs((6, 129), dtype, 5)
    b = torch.linspace(-1, 1, 129).to(dtype) if with_bias else None
    out = OPS.layernorm_cpu(x, w, b, EPS)
    x64 = x.double()
    mean = x64.mean(-1, keepdim=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdim=True)
    expected = (x64 - mean) / torch.sqrt(var + EPS) * w.double()
    if b is not None:
        expected = expected + b.double()
    assert_close(out, expected, dtype, 129)


def test_rmsnorm_rejects_a_weight_of_the_wrong_size() -> None:
    x, w = _inputs((2, 8), torch.float32, 6)
    with pytest.raises(ValueError, match="hidden"):
        OPS.rmsnorm_cpu(x, w[:7], EPS)


def test_fused_add_rmsnorm_rejects_a_residual_of_another_shape() -> None:
    x, w = _inputs((2, 8), torch.float32, 7)
    with pytest.raises(ValueError, match="residual"):
        OPS.fused_add_rmsnorm_cpu(x, x[:1].clone(), w, EPS)
