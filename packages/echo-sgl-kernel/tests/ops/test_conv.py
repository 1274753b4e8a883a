"""conv3d_embed_cpu: non-overlapping patches times the flattened kernel, against float64."""

from __future__ import annotations

import pytest
import torch

import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel)

from .tolerance import assert_close

OPS = torch.ops.sgl_kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_conv3d_embed_is_a_patch_matmul(dtype: torch.dtype, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    n, c, o, kernel = 2, 3, 5, (2, 3, 2)
    x = torch.randn(n, c, 4, 6, 4, generator=gen).to(dtype)
    w = torch.randn(o, c, *kernel, generator=gen).to(dtype)
    bias = torch.randn(o, generator=gen).to(dtype) if with_bias else None
    out = OPS.conv3d_embed_cpu(x, OPS.conv3d_embed_weight_pack(w), bias, True)
    # patches[n, d, h, w, (c, i, j, k)] . weight[o, (c, i, j, k)]
    patches = (
        x.double()
        .unfold(2, 2, 2)
        .unfold(3, 3, 3)
        .unfold(4, 2, 2)
        .permute(0, 2, 3, 4, 1, 5, 6, 7)
        .reshape(n, 2, 2, 2, -1)
    )
    expected = patches @ w.double().reshape(o, -1).t()
    if bias is not None:
        expected = expected + bias.double()
    expected = expected.permute(0, 4, 1, 2, 3)
    terms = patches.abs() @ w.double().reshape(o, -1).abs().t()
    scale = float(terms.max()) + (float(bias.double().abs().max()) if bias is not None else 0.0)
    assert_close(out, expected, dtype, c * 12, scale=scale)


def test_conv3d_embed_rejects_input_that_does_not_tile() -> None:
    with pytest.raises(ValueError, match="multiples"):
        OPS.conv3d_embed_cpu(torch.ones(1, 1, 3, 4, 4), torch.ones(2, 1, 2, 2, 2), None, True)
