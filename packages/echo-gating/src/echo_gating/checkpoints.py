"""Checkpoint ("sweet spot") selection: the few depths where a gate separates best.

Per depth d, from gate samples (layer confidence, was the depth-d token accepted): the exact AUC
``A_d`` and its Hanley-McNeil standard error ``SE_d`` (:mod:`echo_gating.separation`).

Objective: choose the set C of checkpoint depths maximising ``sum_{d in C} L_d`` where
``L_d = A_d - z * SE_d`` is the AUC's lower confidence bound (z = 1.96), subject to
``|C| <= k``, ``d >= min_depth``, pairwise spacing ``>= min_gap`` and, per depth, at least
``min_class_count`` accepted and rejected samples. The objective is additive, so the optimum is
the k best depths by ``L_d`` (ties to the shallower depth), picked greedily under the spacing
rule (exact for ``min_gap = 1``). Using the lower bound keeps a depth with few samples from
winning on noise.

``k`` is a parameter; by default it comes from the data: only depths with ``L_d >= min_auc``
compete, and at most ``max_checkpoints`` (3) of them are kept. A depth where the classes
overlap (AUC near 0.5) is never chosen by default: a gate there would truncate at random.

Worked example: lower bounds ``{1: 0.97, 2: 0.95, 3: 0.90, 4: 0.70, 5: 0.55}``, min_auc 0.75,
max 3 -> C = (1, 2, 3); with min_gap 2 -> C = (1, 3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from echo_gating.errors import CalibrationError
from echo_gating.separation import auc_standard_error

Z_95 = 1.96
"""Normal quantile of the two-sided 95% confidence bound."""


@dataclass(frozen=True, slots=True)
class DepthSeparation:
    """Gate-sample statistics of one depth."""

    depth: int
    count: int
    accepted: int
    auc: float  # NaN when a class is empty
    overlap: float  # NaN when a class is empty

    @property
    def rejected(self) -> int:
        return self.count - self.accepted

    def auc_lower_bound(self, z: float = Z_95) -> float:
        if math.isnan(self.auc):
            return math.nan
        return self.auc - z * auc_standard_error(self.auc, self.accepted, self.rejected)


def select_checkpoints(
    stats: Sequence[DepthSeparation],
    *,
    num_checkpoints: int | None = None,
    max_checkpoints: int = 3,
    min_auc: float = 0.75,
    min_class_count: int = 20,
    min_depth: int = 1,
    min_gap: int = 1,
) -> tuple[int, ...]:
    """The chosen checkpoint depths, ascending (see the module docstring)."""
    if num_checkpoints is not None and num_checkpoints < 0:
        raise CalibrationError(f"num_checkpoints must be >= 0, got {num_checkpoints}")
    if max_checkpoints < 0 or min_gap < 1:
        raise CalibrationError(
            f"need max_checkpoints >= 0 and min_gap >= 1, got {max_checkpoints}, {min_gap}"
        )
    eligible = [
        s
        for s in stats
        if s.depth >= min_depth
        and min(s.accepted, s.rejected) >= min_class_count
        and not math.isnan(s.auc)
    ]
    ranked = sorted(eligible, key=lambda s: (-s.auc_lower_bound(), s.depth))
    if num_checkpoints is None:
        ranked = [s for s in ranked if s.auc_lower_bound() >= min_auc]
        k = max_checkpoints
    else:
        k = num_checkpoints
    chosen: list[int] = []
    for s in ranked:
        if len(chosen) >= k:
            break
        if all(abs(s.depth - c) >= min_gap for c in chosen):
            chosen.append(s.depth)
    return tuple(sorted(chosen))
