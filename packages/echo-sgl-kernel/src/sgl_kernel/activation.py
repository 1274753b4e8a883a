"""Gated activations: ``act(x[..., :d]) * x[..., d:]`` with d = x.shape[-1] / 2.

The gate and the product are computed in float32 and rounded to the input dtype once; for a
float32 input that is exactly SGLang's ``forward_native`` (``F.silu(x[..., :d]) * x[..., d:]``).
``input`` is ``[..., 2 * d]``; the result is a new ``[..., d]`` tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sgl_kernel.library import register

__all__ = ["gelu_and_mul_cpu", "gelu_tanh_and_mul_cpu", "silu_and_mul_cpu"]


def _halves(input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if input.dim() < 1 or input.shape[-1] % 2 != 0:
        raise ValueError(f"input must be [..., 2 * d], got shape {tuple(input.shape)}")
    d = input.shape[-1] // 2
    x32 = input.float()
    return x32[..., :d], x32[..., d:]


def silu_and_mul_cpu(input: torch.Tensor) -> torch.Tensor:
    """out = silu(a) * b with a, b = the two halves of the last dim; silu(a) = a / (1 + exp(-a)).

    Example: input = [0, 2, 5, 7] -> a = [0, 2], b = [5, 7] -> [0, 2 / (1 + e^-2) * 7] = [0, 12.33].
    """
    gate, up = _halves(input)
    return (F.silu(gate) * up).to(input.dtype)


def gelu_and_mul_cpu(input: torch.Tensor) -> torch.Tensor:
    """out = gelu(a) * b, exact gelu: gelu(a) = a / 2 * (1 + erf(a / sqrt(2)))."""
    gate, up = _halves(input)
    return (F.gelu(gate) * up).to(input.dtype)


def gelu_tanh_and_mul_cpu(input: torch.Tensor) -> torch.Tensor:
    """out = gelu(a) * b, tanh form.

    gelu(a) = a / 2 * (1 + tanh(sqrt(2 / pi) * (a + 0.044715 a^3))).
    """
    gate, up = _halves(input)
    return (F.gelu(gate, approximate="tanh") * up).to(input.dtype)


register("silu_and_mul_cpu(Tensor input) -> Tensor", silu_and_mul_cpu)
register("gelu_and_mul_cpu(Tensor input) -> Tensor", gelu_and_mul_cpu)
register("gelu_tanh_and_mul_cpu(Tensor input) -> Tensor", gelu_tanh_and_mul_cpu)
