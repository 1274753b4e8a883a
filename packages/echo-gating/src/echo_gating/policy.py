"""The gate policy: which depths are checkpoints, their thresholds, and the calibrated maps.

At a checkpoint depth d a request with layer confidence ``C_b(d)`` (see :mod:`echo_gating.signals`)
may extend deeper iff ``C_b(d) >= tau_d``; off-checkpoint every request may extend. ``signal``
names the per-request value thresholded (``layer_confidence`` by default; ``sibling_margin``,
the drafter's top-2 margin at the request's best node, is the one the ranking key does not
hold): :data:`echo_gating.signals.GATE_SIGNALS`. Modes:

- ``SPARSE`` (ECHO): a few calibrated checkpoints ("sweet spots"), e.g. ``{2: 0.35, 4: 0.2}``;
- ``DENSE`` (ablation): a threshold at every depth ``1..max_depth`` (EAGLE-2-like gating);
- ``FIXED`` (ablation): one threshold at every depth;
- ``NONE`` (ablation): never gate.

Worked example: ``GatePolicy(version="v1", mode=SPARSE, thresholds={2: 0.4}, acceptance_maps=None,
max_depth=6).gate(2, tensor([0.9, 0.3, 0.0]))`` is ``[True, False, False]`` and ``gate(3, ...)``
is all True (depth 3 is not a checkpoint).

The policy is an artefact: it travels in budget leases (``version``), is stored as strict,
schema-versioned JSON (:mod:`echo_gating.policy_json`), and carries what it was calibrated for
(target/drafter pair, sampling) and the per-depth reference statistics the drift monitor uses.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from echo_gating.errors import CalibrationError, GatingError
from echo_gating.maps import AcceptanceMaps
from echo_gating.signals import DEFAULT_SIGNAL, GATE_SIGNALS


class GateMode(enum.Enum):
    SPARSE = "sparse"
    DENSE = "dense"
    FIXED = "fixed"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class DepthStats:
    """Calibration-time gate statistics of one depth (reference for drift monitoring)."""

    count: int  # gate samples: (request, step) pairs that drafted this depth
    accepted: int  # of which the request's depth-d token was accepted
    auc: float | None  # AUC of layer confidence for accepted; None when a class was empty

    def __post_init__(self) -> None:
        if self.count < 0 or not 0 <= self.accepted <= self.count:
            raise CalibrationError(
                f"depth stats need 0 <= accepted <= count, got accepted={self.accepted}, "
                f"count={self.count}"
            )
        if self.auc is not None and not 0.0 <= self.auc <= 1.0:
            raise CalibrationError(f"depth stats AUC must lie in [0, 1], got {self.auc}")

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.count if self.count else math.nan


@dataclass(frozen=True, slots=True)
class GatePolicy:
    """A calibrated (or ablation) gating policy; see the module docstring."""

    version: str  # content hash ("sha256:...") or a user label; travels in leases
    mode: GateMode
    thresholds: Mapping[int, float]  # depth -> threshold on layer confidence, in [0, 1]
    acceptance_maps: AcceptanceMaps | None  # node path_logprob -> P(node accepted)
    max_depth: int
    gate_maps: AcceptanceMaps | None = None  # log C_b(d) -> P(request accepts at depth d)
    reference: Mapping[int, DepthStats] = field(default_factory=dict)
    calibrated_for: Mapping[str, str] = field(default_factory=dict)  # target, drafter, sampling
    signal: str = DEFAULT_SIGNAL  # what the thresholds compare with (GATE_SIGNALS)

    def __post_init__(self) -> None:
        if self.signal not in GATE_SIGNALS:
            raise CalibrationError(
                f"gate signal {self.signal!r} is not one of {sorted(GATE_SIGNALS)}"
            )
        if not isinstance(self.version, str) or not self.version:
            raise CalibrationError(
                f"policy version must be a non-empty string, got {self.version!r}"
            )
        if not isinstance(self.mode, GateMode):
            raise CalibrationError(f"policy mode must be a GateMode, got {self.mode!r}")
        if isinstance(self.max_depth, bool) or not isinstance(self.max_depth, int):
            raise CalibrationError(f"max_depth must be an int, got {self.max_depth!r}")
        if self.max_depth < 1:
            raise CalibrationError(f"max_depth must be >= 1, got {self.max_depth}")
        thresholds = {int(d): float(t) for d, t in sorted(self.thresholds.items())}
        for d, t in thresholds.items():
            if not 1 <= d <= self.max_depth:
                raise CalibrationError(
                    f"threshold at depth {d}: depths run from 1 to max_depth={self.max_depth}"
                )
            if not (math.isfinite(t) and 0.0 <= t <= 1.0):
                raise CalibrationError(
                    f"threshold at depth {d} is {t}: must be a finite probability in [0, 1]"
                )
        self._check_mode(thresholds)
        for d in self.reference:
            if d < 1:
                raise CalibrationError(f"reference statistics for depth {d}: depths start at 1")
        object.__setattr__(self, "thresholds", thresholds)
        object.__setattr__(self, "reference", dict(sorted(self.reference.items())))
        object.__setattr__(self, "calibrated_for", dict(sorted(self.calibrated_for.items())))

    def __hash__(self) -> int:  # the mappings are dicts; hash what identifies the gating
        return hash(
            (self.version, self.mode, tuple(self.thresholds.items()), self.max_depth, self.signal)
        )

    def _check_mode(self, thresholds: Mapping[int, float]) -> None:
        every = set(range(1, self.max_depth + 1))
        if self.mode is GateMode.NONE and thresholds:
            raise CalibrationError(f"mode none takes no thresholds, got {dict(thresholds)}")
        if self.mode in (GateMode.DENSE, GateMode.FIXED) and set(thresholds) != every:
            raise CalibrationError(
                f"mode {self.mode.value} needs a threshold at every depth 1..{self.max_depth}, "
                f"got depths {sorted(thresholds)}"
            )
        if self.mode is GateMode.FIXED and len(set(thresholds.values())) > 1:
            raise CalibrationError(f"mode fixed needs one threshold, got {dict(thresholds)}")

    # ---- ablation constructors -------------------------------------------------------------
    @classmethod
    def none(cls, max_depth: int = 1, version: str = "none") -> GatePolicy:
        """Never gate (every request may always extend)."""
        return cls(version, GateMode.NONE, {}, None, max_depth)

    @classmethod
    def fixed(cls, threshold: float, max_depth: int, version: str | None = None) -> GatePolicy:
        """One threshold at every depth ``1..max_depth``."""
        thresholds = dict.fromkeys(range(1, max_depth + 1), threshold)
        return cls(version or f"fixed-{threshold:g}", GateMode.FIXED, thresholds, None, max_depth)

    @classmethod
    def dense(
        cls, thresholds_per_depth: Mapping[int, float], version: str | None = None
    ) -> GatePolicy:
        """A threshold at every depth; the keys must be exactly ``1..max(keys)``."""
        if not thresholds_per_depth:
            raise CalibrationError("dense gating needs at least one threshold")
        max_depth = max(thresholds_per_depth)
        label = version or "dense-" + "-".join(
            f"{t:g}" for _, t in sorted(thresholds_per_depth.items())
        )
        return cls(label, GateMode.DENSE, thresholds_per_depth, None, max_depth)

    @classmethod
    def sparse(
        cls, thresholds: Mapping[int, float], max_depth: int, version: str | None = None
    ) -> GatePolicy:
        """Checkpoints ``thresholds`` (depth -> tau) without maps, e.g. for tests and overrides."""
        label = version or "sparse-" + "-".join(f"{d}:{t:g}" for d, t in sorted(thresholds.items()))
        return cls(label, GateMode.SPARSE, thresholds, None, max_depth)

    # ---- gating ----------------------------------------------------------------------------
    @property
    def checkpoints(self) -> tuple[int, ...]:
        """Depths with a threshold, ascending (empty for NONE)."""
        return tuple(self.thresholds)

    def is_checkpoint(self, depth: int) -> bool:
        return self.mode is not GateMode.NONE and depth in self.thresholds

    def threshold(self, depth: int) -> float | None:
        """The threshold at ``depth``, None off-checkpoint."""
        return self.thresholds.get(depth) if self.mode is not GateMode.NONE else None

    def gate(self, depth: int, confidence: Tensor) -> Tensor:
        """[B] float32 layer confidence at ``depth`` -> [B] bool, True = may extend deeper."""
        if depth < 1:
            raise GatingError(f"depth must be >= 1, got {depth}")
        if confidence.dim() != 1 or not confidence.is_floating_point():
            raise GatingError(
                f"confidence must be a [B] float tensor, got {tuple(confidence.shape)} "
                f"{confidence.dtype}"
            )
        tau = self.threshold(depth)
        if tau is None:
            return torch.ones_like(confidence, dtype=torch.bool)
        return confidence >= tau

    # ---- persistence -----------------------------------------------------------------------
    def to_json(self) -> str:
        from echo_gating.policy_json import (
            policy_to_json,
        )  # deferred: policy_json imports this module

        return policy_to_json(self)

    @classmethod
    def from_json(cls, text: str) -> GatePolicy:
        from echo_gating.policy_json import (
            policy_from_json,
        )  # deferred: policy_json imports this module

        return policy_from_json(text)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> GatePolicy:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise CalibrationError(f"gate policy {path} is not UTF-8 text: {exc}") from exc
        return cls.from_json(text)
