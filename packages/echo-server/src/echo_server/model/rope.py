"""Rotary position embedding (RoPE), rotate-half convention (HF Llama layout).

Inverse frequencies ``f_i = theta ** (-2 i / D)`` for ``i in [0, D/2)``, then optionally scaled:

- ``linear``: ``f_i / factor``;
- ``llama3``: with wavelength ``w_i = 2 pi / f_i``, ``lo = L0 / low_freq_factor`` and
  ``hi = L0 / high_freq_factor`` (``L0`` = original context): ``f_i`` if ``w_i < hi``,
  ``f_i / factor`` if ``w_i > lo``, else ``(1 - s) f_i / factor + s f_i`` with
  ``s = (L0 / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``;
- GGUF llama3 files store per-frequency divisors instead (``rope_freqs.weight``): ``f_i / r_i``.

At position ``p`` the angle is ``a_i = p f_i`` and a head vector ``x = [x1, x2]`` (halves) maps to
``[x1 cos a - x2 sin a, x2 cos a + x1 sin a]``, i.e. ``x cos + rotate_half(x) sin`` with
``rotate_half(x) = [-x2, x1]``. Example: D = 2, f = 1, p = pi / 2 maps ``[1, 0]`` to ``[0, 1]``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from echo_server.model.config import ModelConfig


def inv_frequencies(config: ModelConfig, freq_divisors: Tensor | None = None) -> Tensor:
    """RoPE inverse frequencies: [head_dim / 2] float32 (module docstring)."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling
    if scaling is not None and scaling.kind == "linear":
        inv = inv / scaling.factor
    elif scaling is not None and scaling.kind == "llama3":
        lo_wavelen = scaling.original_max_position / scaling.low_freq_factor
        hi_wavelen = scaling.original_max_position / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > lo_wavelen, inv / scaling.factor, inv)
        smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = (wavelen >= hi_wavelen) & (wavelen <= lo_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    if freq_divisors is not None:
        inv = inv / freq_divisors.to(torch.float32)
    return inv


class RotaryTable:
    """Precomputed ``cos``/``sin`` of every position up to ``max_position``.

    Angles are computed in float32 (``p * f_i``, as HF does) and stored in the model dtype.
    """

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        freq_divisors: Tensor | None = None,
    ) -> None:
        inv = inv_frequencies(config, freq_divisors)
        angles = torch.arange(config.max_position, dtype=torch.float32)[:, None] * inv[None, :]
        self.cos = angles.cos().to(dtype=dtype, device=device)  # [P, D/2]
        self.sin = angles.sin().to(dtype=dtype, device=device)  # [P, D/2]

    def lookup(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``cos``, ``sin`` at ``positions`` [R] int64: two [R, 1, D/2] tensors."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def apply(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate ``x`` [R, heads, D] at ``positions`` [R] int64; returns a new [R, heads, D]."""
        return rotate(x, *self.lookup(positions))


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``[x1 cos - x2 sin, x2 cos + x1 sin]`` for ``x`` [..., heads, D], cos/sin [..., 1, D/2]
    (the target's rows [R, heads, D]; the draft head's any leading shape)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
