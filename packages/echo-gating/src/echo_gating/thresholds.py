"""Per-checkpoint thresholds on layer confidence: a cost-aware utility rule and Youden's J.

At a checkpoint depth d a request with layer confidence c may extend deeper iff ``c >= tau_d``.
Let ``y = 1`` when the request's depth-d token was accepted, and ``r`` the *cost ratio*: the
cost of one verified budget token in units of one accepted token. In the compute-bound regime a
verified token raises throughput iff its acceptance probability beats the batch's draft yield
(accepted / verified), so ``r`` is that break-even yield (``CalibrationConfig.cost_ratio``).

Utility rule (the default): maximise the empirical net gain of the requests allowed through,

    tau_u = argmax_tau  sum_{i: c_i >= tau} (y_i - r).

Among upper sets of a monotone score this is the same as thresholding the isotonic estimate of
``P(y = 1 | c)`` at ``r`` ("keep extending while P(accept | c) * token_value >= token_cost").

Youden's J: ``tau_J = argmax_tau TPR(tau) - FPR(tau)``, i.e. the same sum with weights
``y_i / n1 - (1 - y_i) / n0``. It ignores the cost and the class prior: it puts the threshold
where the two class densities cross, which is the utility optimum only when
``r / (1 - r) = P(y=1) / P(y=0)``.

Comparison (``tests/test_thresholds.py``, true expected utility under the known synthetic model,
held-out data): on balanced, equal-variance data the two agree within noise; when the prior is
skewed (deep depths, weak drafters) or the classes have unequal spread, the utility rule keeps a
strictly higher expected gain and recovers the analytic optimum, while Youden's J drifts to the
density crossing. Hence ``utility`` is the default and ``youden`` stays available for ablations.

Both thresholds are one of the observed confidences (so they lie in the observed range); ties
of the objective go to the higher threshold. When even the most confident group loses utility,
``tau`` is the largest observed confidence (gate almost everything).

Worked example: c = [0.9, 0.8, 0.3, 0.2], y = [1, 1, 0, 1], r = 0.5: the cumulative gains from
the top are 0.5, 1.0, 0.5, 1.0; the first maximum is at tau = 0.8. Youden (n1 = 3, n0 = 1):
cumulative J = 1/3, 2/3, -1/3, 0 -> tau_J = 0.8 too.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from echo_gating.errors import GatingError

ThresholdRule = Literal["utility", "youden"]


def best_upper_threshold(scores: Tensor, weights: Tensor) -> float:
    """``argmax_tau sum_{i: s_i >= tau} w_i`` over observed tau: [n] float, [n] float -> tau."""
    if scores.dim() != 1 or weights.shape != scores.shape or scores.numel() == 0:
        raise GatingError(
            f"scores and weights must be non-empty [n] tensors, got {tuple(scores.shape)} and "
            f"{tuple(weights.shape)}"
        )
    s = scores.detach().to(device="cpu", dtype=torch.float64)
    w = weights.detach().to(device="cpu", dtype=torch.float64)
    values, inverse = torch.unique(s, sorted=True, return_inverse=True)  # ascending
    per_value = torch.zeros_like(values).index_add_(0, inverse, w)
    gain = torch.cumsum(per_value.flip(0), 0)  # gain[k]: pass the top k+1 distinct values
    best = int(torch.argmax(gain))  # first maximum: the highest threshold among ties
    if float(gain[best]) < 0.0:
        return float(values[-1])
    return float(values.flip(0)[best])


def utility_threshold(confidence: Tensor, accepted: Tensor, cost_ratio: float) -> float:
    """Utility-rule threshold: [n] float, [n] bool, r in (0, 1) -> tau (see module docstring)."""
    if not 0.0 < cost_ratio < 1.0:
        raise GatingError(f"cost_ratio must lie in (0, 1), got {cost_ratio}")
    _check_labels(confidence, accepted)
    return best_upper_threshold(confidence, accepted.to(torch.float64) - cost_ratio)


def youden_threshold(confidence: Tensor, accepted: Tensor) -> float:
    """Youden's-J threshold: [n] float, [n] bool with both classes present -> tau."""
    _check_labels(confidence, accepted)
    n1 = int(accepted.sum())
    n0 = int(accepted.numel()) - n1
    if n1 == 0 or n0 == 0:
        raise GatingError(f"Youden's J needs both classes, got {n1} accepted and {n0} rejected")
    y = accepted.to(torch.float64)
    return best_upper_threshold(confidence, y / n1 - (1.0 - y) / n0)


def choose_threshold(
    confidence: Tensor, accepted: Tensor, rule: ThresholdRule, cost_ratio: float
) -> float:
    """Dispatch on ``rule``; Youden falls back to the utility rule when a class is missing."""
    if rule == "youden" and 0 < int(accepted.sum()) < accepted.numel():
        return youden_threshold(confidence, accepted)
    if rule not in ("utility", "youden"):
        raise GatingError(f"unknown threshold rule {rule!r}; expected 'utility' or 'youden'")
    return utility_threshold(confidence, accepted, cost_ratio)


def _check_labels(confidence: Tensor, accepted: Tensor) -> None:
    if accepted.dtype != torch.bool or accepted.shape != confidence.shape:
        raise GatingError(
            f"accepted must be a bool tensor shaped like confidence {tuple(confidence.shape)}, "
            f"got {tuple(accepted.shape)} {accepted.dtype}"
        )
