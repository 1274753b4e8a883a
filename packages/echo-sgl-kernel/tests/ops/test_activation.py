"""Gated activations against float64 formulas, in float32 and bfloat16, on odd shapes."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel)

from .tolerance import assert_close

OPS = torch.ops.sgl_kernel
DTYPES = [torch.float32, torch.bfloat16]
SHAPES = [(1, 2), (7, 34), (2, 3, 514)]


def _silu(a: torch.Tensor) -> torch.Tensor:
    return a / (1.0 + torch.exp(-a))


def _gelu(a: torch.Tensor) -> torch.Tensor:
    return 0.5 * a * (1.0 + torch.erf(a / math.sqrt(2.0)))


def _gelu_tanh(a: torch.Tensor) -> torch.Tensor:
    return 0.5 * a * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a**3)))


CASES: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("silu_and_mul_cpu", _silu),
    ("gelu_and_mul_cpu", _gelu),
    ("gelu_tanh_and_mul_cpu", _gelu_tanh),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("op", "act"), CASES)
def test_gated_activation_matches_formula(
    dtype: torch.dtype,
    shape: tuple[int, ...],
    op: str,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=gen) * 4).to(dtype)
    out = getattr(OPS, op)(x)
    d = shape[-1] // 2
    x64 = x.double()
    expected = act(x64[..., :d]) * x64[..., d:]
    assert out.dtype == dtype
    assert out.shape == (*shape[:-1], d)
    # a few float32 operations per element, rounded once to dtype
    assert_close(out, expected, dtype, 4)


def test_silu_and_mul_worked_example() -> None:
    out = OPS.silu_and_mul_cpu(torch.tensor([[0.0, 2.0, 5.0, 7.0]]))
    assert_close(out, torch.tensor([[0.0, 2.0 / (1 + math.exp(-2.0)) * 7.0]]), torch.float32, 4)


@pytest.mark.parametrize("op", [name for name, _ in CASES])
def test_gated_activation_rejects_an_odd_last_dim(op: str) -> None:
    with pytest.raises(ValueError, match=r"2 \* d"):
        getattr(OPS, op)(torch.ones(2, 5))
