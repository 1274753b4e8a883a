"""Normalisation ops: RMSNorm (Llama, Gemma, Gemma 3 and Gemma 4 forms; plain and fused with
the residual add) and LayerNorm.

All statistics are taken in float32 and each output is rounded to the input dtype once, the
order SGLang's own ``forward_native`` uses, so float32 results equal the native layer bit for
bit. Shapes: ``input`` is ``[..., hidden]`` (any leading dims), ``weight`` / ``bias`` are
``[hidden]``.
"""

from __future__ import annotations

import torch

from sgl_kernel.library import register

__all__ = [
    "fused_add_rmsnorm_cpu",
    "gemma3_rmsnorm_cpu",
    "gemma4_rmsnorm_cpu",
    "gemma_fused_add_rmsnorm_cpu",
    "gemma_rmsnorm_cpu",
    "layernorm_cpu",
    "rmsnorm_cpu",
]


def _check(input: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    if input.dim() < 1 or weight.dim() != 1 or input.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"input [..., hidden] and weight [hidden] expected, got {tuple(input.shape)} "
            f"and {tuple(weight.shape)}"
        )
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def _rms_normalize(x32: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, float32 in and out."""
    variance = x32.pow(2).mean(dim=-1, keepdim=True)
    return x32 * torch.rsqrt(variance + eps)


def rmsnorm_cpu(input: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * w, in float32, rounded once to ``input.dtype``.

    Example: x = [3, 4], w = [1, 2], eps = 0: mean(x^2) = 12.5, y = [0.8485, 2.2627].
    """
    _check(input, weight, eps)
    return (_rms_normalize(input.float(), eps) * weight).to(input.dtype)


def fused_add_rmsnorm_cpu(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    """In place: s = x + r (float32); ``residual`` <- s; ``input`` <- s / sqrt(mean(s^2) + eps) * w.

    The norm is taken over the float32 sum, not over its rounded copy in ``residual``.
    """
    _check(input, weight, eps)
    _add_then_normalize(input, residual, weight, eps)


def _add_then_normalize(
    input: torch.Tensor, residual: torch.Tensor, gain: torch.Tensor, eps: float
) -> None:
    """In place: s = x + r (float32); ``residual`` <- s; ``input`` <- s / sqrt(mean(s^2) + eps) *
    gain (the fused-add norms differ only in their gain)."""
    if residual.shape != input.shape:
        raise ValueError(
            f"residual shape {tuple(residual.shape)} != input shape {tuple(input.shape)}"
        )
    summed = input.float() + residual.float()
    residual.copy_(summed)
    input.copy_(_rms_normalize(summed, eps) * gain)


def gemma_rmsnorm_cpu(input: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: y = x / sqrt(mean(x^2) + eps) * (1 + w), float32, rounded once."""
    _check(input, weight, eps)
    return (_rms_normalize(input.float(), eps) * (1.0 + weight.float())).to(input.dtype)


def gemma_fused_add_rmsnorm_cpu(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    """In place: s = x + r; ``residual`` <- s; ``input`` <- s / sqrt(mean(s^2) + eps) * (1 + w)."""
    _check(input, weight, eps)
    _add_then_normalize(input, residual, 1.0 + weight.float(), eps)


def gemma3_rmsnorm_cpu(input: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma 3's RMSNorm, the same formula as :func:`gemma_rmsnorm_cpu`: x̂ * (1 + w)."""
    return gemma_rmsnorm_cpu(input, weight, eps)


def gemma4_rmsnorm_cpu(
    input: torch.Tensor, weight: torch.Tensor, eps: float, scale_shift: float, with_scale: bool
) -> torch.Tensor:
    """Gemma 4's RMSNorm: y = x̂ * (w + scale_shift) with a scale, y = x̂ without one.

    x̂ = x / sqrt(mean(x^2) + eps), float32, rounded once to ``input.dtype``.
    """
    _check(input, weight, eps)
    normed = _rms_normalize(input.float(), eps)
    if with_scale:
        normed = normed * (weight.float() + scale_shift)
    return normed.to(input.dtype)


def layernorm_cpu(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """y = (x - mean(x)) / sqrt(var(x) + eps) * w + b (biased variance), float32, rounded once."""
    _check(input, weight, eps)
    x32 = input.float()
    mean = x32.mean(dim=-1, keepdim=True)
    variance = (x32 - mean).pow(2).mean(dim=-1, keepdim=True)
    y = (x32 - mean) * torch.rsqrt(variance + eps) * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(input.dtype)


register("rmsnorm_cpu(Tensor input, Tensor weight, float eps) -> Tensor", rmsnorm_cpu)
register(
    "fused_add_rmsnorm_cpu(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps) -> ()",
    fused_add_rmsnorm_cpu,
)
register("gemma_rmsnorm_cpu(Tensor input, Tensor weight, float eps) -> Tensor", gemma_rmsnorm_cpu)
register(
    "gemma_fused_add_rmsnorm_cpu(Tensor(a!) input, Tensor(b!) residual, Tensor weight, "
    "float eps) -> ()",
    gemma_fused_add_rmsnorm_cpu,
)
register("gemma3_rmsnorm_cpu(Tensor input, Tensor weight, float eps) -> Tensor", gemma3_rmsnorm_cpu)
register(
    "gemma4_rmsnorm_cpu(Tensor input, Tensor weight, float eps, float scale_shift, "
    "bool with_scale) -> Tensor",
    gemma4_rmsnorm_cpu,
)
register(
    "layernorm_cpu(Tensor input, Tensor weight, Tensor? bias, float eps) -> Tensor", layernorm_cpu
)
