"""Weight packing and the packed GEMM against a float64 matmul."""

from __future__ import annotations

import pytest
import torch

import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel)

from .tolerance import assert_close

OPS = torch.ops.sgl_kernel
DTYPES = [torch.float32, torch.bfloat16]


def test_convert_weight_packed_is_an_equal_contiguous_copy() -> None:
    weight = torch.randn(48, 32, generator=torch.Generator().manual_seed(0)).t()  # strided
    packed = OPS.convert_weight_packed(weight)
    assert packed.is_contiguous()
    assert packed.data_ptr() != weight.data_ptr()
    assert torch.equal(packed, weight)


def test_convert_weight_packed_rejects_a_vector() -> None:
    with pytest.raises(ValueError, match="2-D"):
        OPS.convert_weight_packed(torch.ones(4))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 16, 32), (5, 33, 77), (17, 96, 576)])
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, "same"])
def test_weight_packed_linear_matches_matmul(
    dtype: torch.dtype, m: int, n: int, k: int, bias_dtype: torch.dtype | str | None
) -> None:
    gen = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    bias = None
    if bias_dtype is not None:
        bias = torch.randn(n, generator=gen).to(dtype if bias_dtype == "same" else torch.float32)
    packed = OPS.convert_weight_packed(w)
    out = OPS.weight_packed_linear(x, packed, bias, True)
    expected = x.double() @ w.double().t()
    if bias is not None:
        expected = expected + bias.double()
    assert out.dtype == dtype
    assert out.shape == (m, n)
    # the reduced terms are |x_i w_i|, plus the bias added after the sum
    scale = float((x.double().abs() @ w.double().abs().t()).max())
    if bias is not None:
        scale += float(bias.double().abs().max())
    assert_close(out, expected, dtype, k, scale=scale)
    assert torch.equal(OPS.weight_packed_linear(x, w, bias, False), out)


def test_weight_packed_linear_rejects_mismatched_inner_dims() -> None:
    with pytest.raises(ValueError, match="mat2"):
        OPS.weight_packed_linear(torch.ones(2, 8), torch.ones(4, 7), None, True)
