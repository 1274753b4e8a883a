"""float_tolerance: the documented formula, and it separates rounding from real deviations."""

from __future__ import annotations

import math

import pytest
import torch

from echo_core.tolerance import SAFETY, float_tolerance

EPS32 = torch.finfo(torch.float32).eps


def test_formula_of_the_docstring() -> None:
    got = float_tolerance(torch.float32, 1536, 30, scale=36.8)
    assert got == pytest.approx(SAFETY * 36.8 * math.sqrt(30) * EPS32 * (1 + math.sqrt(1536)))
    assert got == pytest.approx(3.86e-3, rel=1e-2)  # the docstring's SmolLM2 example
    assert float_tolerance(torch.float64, 4) == pytest.approx(SAFETY * 3 * 2**-52)


def test_half_types_accumulate_in_float32() -> None:
    bf16 = torch.finfo(torch.bfloat16).eps
    assert float_tolerance(torch.bfloat16, 100) == pytest.approx(SAFETY * (bf16 + 10 * EPS32))
    assert float_tolerance(torch.float16, 100) < float_tolerance(torch.bfloat16, 100)


def test_grows_with_reduction_depth_and_scale() -> None:
    base = float_tolerance(torch.float32, 64)
    assert float_tolerance(torch.float32, 256) > base
    assert float_tolerance(torch.float32, 64, 4) == pytest.approx(2 * base)
    assert float_tolerance(torch.float32, 64, scale=10.0) == pytest.approx(10 * base)
    assert float_tolerance(torch.float32, 64, scale=0.0) == 0.0


@pytest.mark.parametrize(
    ("dtype", "reduction", "depth", "scale"),
    [(torch.int64, 4, 1, 1.0), (torch.float32, 0, 1, 1.0), (torch.float32, 4, 0, 1.0),
     (torch.float32, 4, 1, -1.0), (torch.float32, 4, 1, math.nan)],
)  # fmt: skip
def test_rejects_bad_arguments(
    dtype: torch.dtype, reduction: int, depth: int, scale: float
) -> None:
    with pytest.raises(ValueError, match=r"float_tolerance|reduction|scale"):
        float_tolerance(dtype, reduction, depth, scale=scale)


@pytest.mark.parametrize("n", [16, 256, 4096])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_bounds_matmul_rounding_but_not_lower_input_precision(n: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(256, n, generator=g).to(dtype)
    w = torch.randn(64, n, generator=g).to(dtype)
    exact = x.double() @ w.double().T  # the same (rounded) inputs, float64 products
    atol = float_tolerance(dtype, n, scale=float(exact.abs().max()))
    err = float(((x @ w.T).double() - exact).abs().max())
    assert 0 < err <= atol  # measured: err / atol between 0.008 and 0.1
    if dtype == torch.float32:  # a float32 product of bfloat16-rounded inputs must fail it
        lossy = (x.bfloat16().float() @ w.T).double()
        assert float((lossy - exact).abs().max()) > 10 * atol  # measured: 50x to 880x
