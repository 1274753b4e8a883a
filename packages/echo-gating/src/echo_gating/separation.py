"""How well a signal separates accepted from rejected drafts: exact AUC and distribution overlap.

AUC (Mann-Whitney, tie-aware): with ``n1`` accepted scores ``x`` and ``n0`` rejected scores ``y``,

    AUC = ( #{(i, j): x_i > y_j} + 0.5 * #{(i, j): x_i = y_j} ) / (n1 * n0)
        = ( R1 - n1 (n1 + 1) / 2 ) / (n1 * n0),

where ``R1`` is the sum of the accepted scores' mid-ranks in the pooled sample (tied values share
the mean of the ranks they span). Computed in float64 with one sort: exact for any realistic n.
AUC is 0.5 for a useless signal and 1.0 when every accepted score beats every rejected one.

Standard error (Hanley & McNeil 1982), used to rank depths by a lower confidence bound:

    Q1 = A / (2 - A),  Q2 = 2 A^2 / (1 + A),
    SE^2 = ( A(1-A) + (n1-1)(Q1-A^2) + (n0-1)(Q2-A^2) ) / (n1 n0).

Overlap coefficient: ``OVL = sum_k min(h1_k / n1, h0_k / n0)`` over ``bins`` equal-width bins of
``[lo, hi]`` (the pooled range unless given): 1.0 when the two histograms coincide, 0.0 when the
classes fall in disjoint bins.

Worked example: accepted ``[0.9, 0.5]``, rejected ``[0.5, 0.1]``: pairs (0.9>0.5), (0.9>0.1),
(0.5=0.5 -> 1/2), (0.5>0.1) give AUC = 3.5 / 4 = 0.875. Mid-ranks of the pool
``[0.1, 0.5, 0.5, 0.9]`` are ``[1, 2.5, 2.5, 4]``, R1 = 6.5, (6.5 - 3) / 4 = 0.875.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from echo_gating.errors import GatingError


def auc(scores: Tensor, accepted: Tensor) -> float:
    """Exact tie-aware AUC of ``scores`` ([n] float) for ``accepted`` ([n] bool) vs the rest.

    NaN when either class is empty (the AUC is undefined there).
    """
    s, y = _check(scores, accepted)
    n1 = int(y.sum())
    n0 = int(y.numel()) - n1
    if n1 == 0 or n0 == 0:
        return math.nan
    _, inverse, counts = torch.unique(s, sorted=True, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    midrank = ends - (counts.to(torch.float64) - 1.0) / 2.0  # 1-based mean rank of each value
    r1 = float(midrank[inverse][y].sum())
    return (r1 - n1 * (n1 + 1) / 2.0) / (n1 * n0)


def auc_standard_error(auc_value: float, positives: int, negatives: int) -> float:
    """Hanley-McNeil standard error of an AUC (see the module docstring); inf if undefined."""
    if positives <= 0 or negatives <= 0 or math.isnan(auc_value):
        return math.inf
    a = auc_value
    q1 = a / (2.0 - a)
    q2 = 2.0 * a * a / (1.0 + a)
    var = (a * (1 - a) + (positives - 1) * (q1 - a * a) + (negatives - 1) * (q2 - a * a)) / (
        positives * negatives
    )
    return math.sqrt(max(var, 0.0))


def overlap(
    scores: Tensor, accepted: Tensor, bins: int = 20, value_range: tuple[float, float] | None = None
) -> float:
    """Overlap coefficient of the accepted / rejected histograms; NaN if a class is empty."""
    if bins < 1:
        raise GatingError(f"bins must be >= 1, got {bins}")
    s, y = _check(scores, accepted)
    n1 = int(y.sum())
    n0 = int(y.numel()) - n1
    if n1 == 0 or n0 == 0:
        return math.nan
    lo, hi = (float(s.min()), float(s.max())) if value_range is None else value_range
    if not hi > lo:
        return 1.0  # every score identical: the classes cannot be told apart
    h1 = torch.histc(s[y], bins=bins, min=lo, max=hi) / n1
    h0 = torch.histc(s[~y], bins=bins, min=lo, max=hi) / n0
    return float(torch.minimum(h1, h0).sum())


def _check(scores: Tensor, accepted: Tensor) -> tuple[Tensor, Tensor]:
    if scores.dim() != 1 or accepted.shape != scores.shape or accepted.dtype != torch.bool:
        raise GatingError(
            f"scores must be [n] and accepted [n] bool, got {tuple(scores.shape)} and "
            f"{tuple(accepted.shape)} {accepted.dtype}"
        )
    s = scores.detach().to(device="cpu", dtype=torch.float64)
    if bool(torch.isnan(s).any()):
        raise GatingError(f"scores contain NaN at index {int(torch.isnan(s).nonzero()[0])}")
    return s, accepted.detach().cpu()
