"""Verify-cost model (latency vs verified tokens), its knee K_max, and the goodput-optimal budget.

Verify latency of one target forward over T tokens (T = B roots + K draft nodes) is a hinge:

    t(T) = base + s_mem * T + s_cmp * max(0, T - T0)

flat-ish (slope ``s_mem``) while memory-bound, steeper by ``s_cmp`` once compute-bound; the knee
``T0`` is where extra tokens start to cost: ``K_max = max(0, floor(T0) - B)`` draft tokens.

Fit (:meth:`VerifyCostModel.fit`): for every candidate knee among the measured T, least squares
on the features ``[1, T, max(0, T - T0)]`` with both slopes clamped at >= 0; the knee with the
smallest squared error wins. Roofline (:meth:`VerifyCostModel.roofline`): ``s_mem = 0``,
``base = bytes / BW`` (weights + the batch's KV cache), ``s_cmp = flops_per_token / F``,
``T0 = base / s_cmp``; e.g. Llama-3.1-8B on one H200 (peak x efficiency 0.6 / 0.8), B = 256 at
2,048 context: base = 22.1 ms, T0 = 818 tokens.

Goodput (:func:`choose_budget`): with ``G(k)`` the expected accepted draft tokens when k draft
tokens are verified (non-decreasing, ``G(0) = 0``) and ``t_draft(k)`` the drafting time
(0 for k = 0), pick ``K* = argmax_k (B + G(k)) / (t_draft(k) + t(B + k))`` over
``0 <= k <= min(len(G) - 1, lease)``. k = 0 is plain decoding, so K* never does worse than plain
decoding under the model: where speculation does not pay it is switched off, no cliff.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from echo_scheduler.errors import CostModelError


@dataclass(frozen=True, slots=True)
class Hardware:
    """Peak dense bf16 FLOP/s, memory bandwidth and per-direction NVLink bandwidth (bytes/s) of
    one device, with the efficiencies applied to each.

    Datasheet figures (NVIDIA H100 SXM5 and H200 SXM): 989 TFLOP/s dense bf16 both; HBM 3.35 TB/s
    (H100) and 4.8 TB/s (H200); NVLink 4 at 900 GB/s bidirectional, i.e. 450 GB/s per direction.
    """

    flops: float
    bandwidth: float
    flops_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    link_bandwidth: float = 450e9
    link_efficiency: float = 0.8

    @staticmethod
    def h100() -> Hardware:
        return Hardware(flops=989e12, bandwidth=3.35e12)

    @staticmethod
    def h200() -> Hardware:
        return Hardware(flops=989e12, bandwidth=4.8e12)


@dataclass(frozen=True, slots=True)
class ModelGeometry:
    """What a verify pass reads and computes, per device (divide by the TP degree yourself)."""

    weight_bytes: float  # bytes of weights read per forward (all experts for a busy MoE)
    flops_per_token: float  # 2 x active parameters (+ attention, small at these contexts)
    kv_bytes_per_token: float  # KV cache bytes per context token, all layers

    @staticmethod
    def llama31_8b() -> ModelGeometry:
        """8.0e9 params bf16; 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes."""
        return ModelGeometry(16.0e9, 2 * 8.0e9, 2 * 32 * 8 * 128 * 2)

    @staticmethod
    def qwen3_235b_a22b(devices: int = 8) -> ModelGeometry:
        """235e9 params (22e9 active) bf16 over ``devices`` (TP); 94 layers x 4 KV heads x 128."""
        return ModelGeometry(
            235e9 * 2 / devices, 2 * 22e9 / devices, 2 * 94 * 4 * 128 * 2 / devices
        )


@dataclass(frozen=True, slots=True)
class VerifyCostModel:
    """``t(T) = base + s_mem T + s_cmp max(0, T - T0)`` seconds (module docstring)."""

    base_s: float
    slope_mem_s: float
    slope_compute_s: float
    knee_tokens: float

    def __post_init__(self) -> None:
        values = (self.base_s, self.slope_mem_s, self.slope_compute_s, self.knee_tokens)
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise CostModelError(f"cost model parameters must be finite and >= 0, got {values}")

    def latency(self, tokens: Tensor) -> Tensor:
        """Verify latency in seconds for T = ``tokens`` (any shape, >= 0): float64."""
        t = tokens.to(torch.float64)
        hinge = (t - self.knee_tokens).clamp(min=0)
        return self.base_s + self.slope_mem_s * t + self.slope_compute_s * hinge

    def latency_at(self, tokens: float) -> float:
        """Verify latency in seconds for one T (int or float >= 0), in plain Python."""
        hinge = max(0.0, tokens - self.knee_tokens)
        return self.base_s + self.slope_mem_s * tokens + self.slope_compute_s * hinge

    def k_max(self, batch_size: int) -> int:
        """Draft tokens verifiable before the knee: ``max(0, floor(T0) - B)``."""
        return k_max_at(self.knee_tokens, batch_size)

    @staticmethod
    def fit(tokens: Sequence[float], latency_s: Sequence[float]) -> VerifyCostModel:
        """Least-squares hinge through measured (T, seconds) points (at least 3, T distinct)."""
        t = torch.tensor(tokens, dtype=torch.float64)
        y = torch.tensor(latency_s, dtype=torch.float64)
        if t.dim() != 1 or t.shape != y.shape or t.numel() < 3:
            raise CostModelError(f"need >= 3 matching (T, latency) points, got {len(tokens)}")
        if torch.unique(t).numel() != t.numel() or bool((t < 0).any() | (y < 0).any()):
            raise CostModelError(f"T must be distinct and >= 0, latencies >= 0: {tokens}")
        best: tuple[float, VerifyCostModel] | None = None
        for knee in torch.sort(t).values[:-1].tolist():
            model = _fit_with_knee(t, y, knee)
            err = float(((model.latency(t) - y) ** 2).sum())
            if best is None or err < best[0] - 1e-18:
                best = (err, model)
        assert best is not None  # at least two candidate knees exist
        return best[1]

    @staticmethod
    def roofline(
        hardware: Hardware, model: ModelGeometry, batch_size: int, context: int
    ) -> VerifyCostModel:
        """Roofline hinge for a batch at a mean context length (module docstring)."""
        if batch_size < 0 or context < 0:
            raise CostModelError(f"batch_size, context must be >= 0, got {batch_size}, {context}")
        bytes_read = model.weight_bytes + batch_size * context * model.kv_bytes_per_token
        base = bytes_read / (hardware.bandwidth * hardware.bandwidth_efficiency)
        slope = model.flops_per_token / (hardware.flops * hardware.flops_efficiency)
        return VerifyCostModel(base, 0.0, slope, base / slope)

    @staticmethod
    def smollm2_cpu() -> VerifyCostModel:
        """Fitted to SmolLM2-135M fp32 verify on the 2-core dev CPU (docs/ENVIRONMENT.md)."""
        return VerifyCostModel.fit([1, 4, 16, 64, 256], [0.056, 0.078, 0.087, 0.171, 0.521])


class LatencyModel(Protocol):
    """Anything that predicts verify latency in seconds for T tokens: one T in plain Python, or
    every T of a tensor at once (float64, same shape; equal to ``latency_at`` elementwise).
    Immutable: a corrected curve is a new object (the fixed step's buffers refill their table of
    a model's values when the object changes, echo_scheduler.device.echo_step.StepScalars)."""

    def latency_at(self, tokens: float) -> float: ...

    def latency(self, tokens: Tensor) -> Tensor: ...


@dataclass(frozen=True, slots=True)
class ProfileCost:
    """Verify latency by piecewise-linear interpolation of measured ``(T, seconds)`` points.

    Unlike the hinge it follows a concave start, common on CPUs where the step from one row to a
    few costs more per row than later ones (a GEMV becomes a small, poorly packed GEMM). Beyond
    the last point it extends the last segment's slope; below the first it is flat.
    """

    tokens: tuple[float, ...]
    seconds: tuple[float, ...]
    _points: dict[str, tuple[Tensor, Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )  # the points as float64 tensors, per device

    def __post_init__(self) -> None:
        t, y = self.tokens, self.seconds
        if len(t) < 2 or len(t) != len(y):
            raise CostModelError(f"need >= 2 matching (T, seconds) points, got {len(t)}")
        if any(b <= a for a, b in itertools.pairwise(t)):
            raise CostModelError(f"T must be strictly increasing, got {t}")
        if not all(math.isfinite(v) and v >= 0 for v in (*t, *y)):
            raise CostModelError("T and seconds must be finite and >= 0")

    def latency_at(self, tokens: float) -> float:
        t, y = self.tokens, self.seconds
        if tokens <= t[0]:
            return y[0]
        i = min(bisect.bisect_right(t, tokens), len(t) - 1)  # segment (i - 1, i)
        slope = (y[i] - y[i - 1]) / (t[i] - t[i - 1])
        return max(y[i - 1] + slope * (tokens - t[i - 1]), 0.0)

    def _tensors(self, device: torch.device) -> tuple[Tensor, Tensor]:
        key = str(device)
        if key not in self._points:
            t = torch.tensor(self.tokens, dtype=torch.float64, device=device)
            y = torch.tensor(self.seconds, dtype=torch.float64, device=device)
            self._points[key] = (t, y)
        return self._points[key]

    def latency(self, tokens: Tensor) -> Tensor:
        """``latency_at`` for every T of ``tokens`` (float64, same shape), in the same float64
        operations, so the two agree bit for bit."""
        x = tokens.to(torch.float64)
        t, y = self._tensors(x.device)
        i = torch.searchsorted(t, x, right=True).clamp(max=len(self.tokens) - 1).clamp(min=1)
        t0, t1, y0, y1 = t[i - 1], t[i], y[i - 1], y[i]
        inside = (y0 + (y1 - y0) / (t1 - t0) * (x - t0)).clamp(min=0.0)
        return torch.where(x <= t[0], y[0], inside)


def k_max_at(knee_tokens: float, batch_size: int) -> int:
    """``K_max = max(0, floor(T0) - B)``: draft tokens a verify pass over ``B`` roots takes before
    its knee ``T0`` (module docstring); the one formula of the knee budget."""
    return max(0, math.floor(knee_tokens) - batch_size)


def _fit_with_knee(t: Tensor, y: Tensor, knee: float) -> VerifyCostModel:
    features = torch.stack([torch.ones_like(t), t, (t - knee).clamp(min=0)], dim=1)
    coef = torch.linalg.lstsq(features, y.unsqueeze(1)).solution.squeeze(1)
    if coef[1] < 0 or coef[2] < 0:  # refit with the offending slope pinned at 0
        keep = [0, 2] if coef[1] < 0 else [0, 1]
        sub = torch.linalg.lstsq(features[:, keep], y.unsqueeze(1)).solution.squeeze(1)
        coef = torch.zeros(3, dtype=torch.float64)
        coef[keep] = sub
    c = coef.clamp(min=0).tolist()
    return VerifyCostModel(c[0], c[1], c[2], knee)


@dataclass(frozen=True, slots=True)
class BudgetChoice:
    budget: int  # K*, draft tokens to verify this step (0 = plain decoding)
    goodput: float  # tokens per second at K*
    plain_goodput: float  # tokens per second at K = 0


def gain_curve(utilities: Tensor) -> Tensor:
    """``G(k)`` = sum of the k largest per-token utilities (expected acceptances): [n] -> [n+1]."""
    ordered = torch.sort(utilities.to(torch.float64).flatten(), descending=True).values
    return torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(ordered.clamp(min=0), 0)])


def choose_budget(
    cost: VerifyCostModel,
    batch_size: int,
    gain: Tensor,
    draft_s: float,
    lease: int | None = None,
) -> BudgetChoice:
    """Goodput-optimal K (module docstring); ``gain``: [K_c + 1] float, ``gain[0] == 0``."""
    if gain.dim() != 1 or gain.numel() < 1 or abs(float(gain[0])) > 1e-12:
        raise CostModelError(f"gain must be a 1-D curve starting at 0, got {gain[:3].tolist()}")
    if bool((gain[1:] < gain[:-1] - 1e-9).any()):
        raise CostModelError("gain must be non-decreasing in k")
    if draft_s < 0 or (lease is not None and lease < 0):
        raise CostModelError(f"draft_s and lease must be >= 0, got {draft_s}, {lease}")
    top = gain.numel() - 1 if lease is None else min(gain.numel() - 1, lease)
    k = torch.arange(top + 1, dtype=torch.float64)
    time = cost.latency(batch_size + k) + torch.where(k > 0, draft_s, 0.0)
    goodput = (batch_size + gain[: top + 1].to(torch.float64)) / time
    best = int(torch.argmax(goodput))  # first maximum: the smallest K among ties
    return BudgetChoice(best, float(goodput[best]), float(goodput[0]))
