"""Dense linear layers: the weight "packing" SGLang applies at load time and the GEMM it calls.

The compiled kernels re-block a weight into a VNNI tile layout; here the packed layout is the
plain row-major ``[out_features, in_features]`` weight, so a packed weight stays usable by any
other torch op that reads it (a tied embedding, for one), and ``is_vnni`` only records that the
weight came through :func:`convert_weight_packed`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sgl_kernel.library import register

__all__ = ["convert_weight_packed", "weight_packed_linear"]


def convert_weight_packed(weight: torch.Tensor) -> torch.Tensor:
    """The packed form of ``weight`` ([..., out, in], any dtype): a contiguous copy of it.

    A copy rather than the same tensor, so the op's output never aliases its input.
    """
    if weight.dim() < 2:
        raise ValueError(f"weight must be at least 2-D [..., out, in], got {tuple(weight.shape)}")
    return weight.clone(memory_format=torch.contiguous_format)


def weight_packed_linear(
    mat1: torch.Tensor, mat2: torch.Tensor, bias: torch.Tensor | None, is_vnni: bool
) -> torch.Tensor:
    """out = mat1 @ mat2^T + bias, in ``mat1.dtype``.

    mat1: [M, K] activations; mat2: [N, K] weight (packed or not: the layouts are equal);
    bias: [N] or None, usually float32 (SGLang upcasts it at load time); returns [M, N].
    A float32 bias on a 16-bit input is added to the float32 upcast of the product, then the
    sum is rounded once. ``is_vnni`` is accepted for schema compatibility and changes nothing.
    """
    if mat1.dim() != 2 or mat2.dim() != 2 or mat1.shape[1] != mat2.shape[1]:
        raise ValueError(
            f"mat1 [M, K] and mat2 [N, K] expected, got {tuple(mat1.shape)} and {tuple(mat2.shape)}"
        )
    if bias is not None and bias.shape != (mat2.shape[0],):
        raise ValueError(f"bias must be [{mat2.shape[0]}], got {tuple(bias.shape)}")
    weight = mat2 if mat2.dtype == mat1.dtype else mat2.to(mat1.dtype)
    if bias is None or bias.dtype == mat1.dtype:
        return F.linear(mat1, weight, bias)
    return (F.linear(mat1, weight).float() + bias.float()).to(mat1.dtype)


register("convert_weight_packed(Tensor weight) -> Tensor", convert_weight_packed)
register(
    "weight_packed_linear(Tensor mat1, Tensor mat2, Tensor? bias, bool is_vnni) -> Tensor",
    weight_packed_linear,
)
