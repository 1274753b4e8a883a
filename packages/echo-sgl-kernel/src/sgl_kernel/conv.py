"""The 3-D patch-embedding convolution of SGLang's CPU vision towers (``Conv3dLayer``).

``sglang.srt.layers.conv`` looks ``conv3d_embed_cpu`` up when it is imported, and the server
imports it on every model, so the op must exist even for text-only serving. A patch embedding
cuts the input into non-overlapping kernel-sized blocks: stride = kernel size, no padding, and
out[n, o, d, h, w] = bias[o] + sum_{c, i, j, k} weight[o, c, i, j, k] x[n, c, d Kd + i,
h Kh + j, w Kw + k]. As for linear layers, the packed weight is the plain weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sgl_kernel.library import register

__all__ = ["conv3d_embed_cpu", "conv3d_embed_weight_pack"]


def conv3d_embed_weight_pack(weight: torch.Tensor) -> torch.Tensor:
    """The packed form of a [O, C, Kd, Kh, Kw] conv weight: a contiguous copy of it."""
    if weight.dim() != 5:
        raise ValueError(f"weight must be [O, C, Kd, Kh, Kw], got {tuple(weight.shape)}")
    return weight.clone(memory_format=torch.contiguous_format)


def conv3d_embed_cpu(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, is_vnni: bool
) -> torch.Tensor:
    """Patch-embedding conv3d (stride = kernel, no padding); returns [N, O, D', H', W'].

    input: [N, C, D, H, W] with D, H, W multiples of the kernel; weight: [O, C, Kd, Kh, Kw];
    bias: [O] or None. ``is_vnni`` is accepted for schema compatibility and changes nothing.
    """
    if input.dim() != 5 or weight.dim() != 5 or input.shape[1] != weight.shape[1]:
        raise ValueError(
            f"input [N, C, D, H, W] and weight [O, C, Kd, Kh, Kw] expected, got "
            f"{tuple(input.shape)} and {tuple(weight.shape)}"
        )
    kernel = tuple(int(k) for k in weight.shape[2:])
    if any(size % k != 0 for size, k in zip(input.shape[2:], kernel, strict=True)):
        raise ValueError(f"input dims {tuple(input.shape[2:])} are not multiples of {kernel}")
    w = weight.to(input.dtype)
    b = None if bias is None else bias.to(input.dtype)
    return F.conv3d(input, w, b, stride=kernel)


register("conv3d_embed_weight_pack(Tensor weight) -> Tensor", conv3d_embed_weight_pack)
register(
    "conv3d_embed_cpu(Tensor input, Tensor weight, Tensor? bias, bool is_vnni) -> Tensor",
    conv3d_embed_cpu,
)
