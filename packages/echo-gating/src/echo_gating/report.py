"""The calibration report: every number behind a calibrated policy, with a Markdown rendering.

Worked example of ``to_markdown()`` (abridged)::

    ### Gate calibration `sha256:1f0c...` (mode sparse)
    Checkpoints 1, 2, 3; thresholds by the utility rule at cost ratio 0.50.
    | depth | gate samples | accept rate | AUC | AUC lower | overlap | nodes | ... | threshold |
    |---|---|---|---|---|---|---|---|---|
    | 1 | 4000 | 0.90 | 0.981 | 0.975 | 0.10 | 4000 | ... | 0.412 |
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from echo_gating.policy import GatePolicy


@dataclass(frozen=True, slots=True)
class DepthReport:
    """Calibration statistics of one depth (node fields stay 0 / empty for gate-only input)."""

    depth: int
    gate_samples: int
    gate_accepted: int
    gate_auc: float  # NaN when a class is empty
    gate_auc_lower: float  # 95% lower confidence bound of gate_auc
    gate_overlap: float
    threshold: float | None  # None: not a checkpoint
    nodes: int = 0
    accepted_nodes: int = 0
    node_auc: Mapping[str, float] = field(default_factory=dict)  # signal -> node-level AUC

    @property
    def gate_accept_rate(self) -> float:
        return self.gate_accepted / self.gate_samples if self.gate_samples else math.nan


@dataclass(frozen=True, slots=True)
class CalibrationReport:
    """A calibrated policy and the per-depth statistics that chose it."""

    policy: GatePolicy
    depths: tuple[DepthReport, ...]
    rule: str
    cost_ratio: float

    @property
    def checkpoints(self) -> tuple[int, ...]:
        return self.policy.checkpoints

    @property
    def thresholds(self) -> Mapping[int, float]:
        return self.policy.thresholds

    def depth(self, d: int) -> DepthReport:
        return self.depths[d - 1]

    def to_markdown(self) -> str:
        p = self.policy
        points = ", ".join(str(d) for d in p.checkpoints) or "none"
        signals = sorted({k for row in self.depths for k in row.node_auc})
        head = ["depth", "gate samples", "accept rate", "AUC", "AUC lower", "overlap", "nodes"]
        head += [f"{s} AUC" for s in signals] + ["threshold"]
        lines = [
            f"### Gate calibration `{p.version}` (mode {p.mode.value})",
            f"Checkpoints {points}; thresholds by the {self.rule} rule at cost ratio "
            f"{self.cost_ratio:.2f}.",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for r in self.depths:
            cells = [
                str(r.depth),
                str(r.gate_samples),
                _fmt(r.gate_accept_rate, 2),
                _fmt(r.gate_auc, 3),
                _fmt(r.gate_auc_lower, 3),
                _fmt(r.gate_overlap, 2),
                str(r.nodes),
            ]
            cells += [_fmt(r.node_auc.get(s, math.nan), 3) for s in signals]
            cells.append("-" if r.threshold is None else f"{r.threshold:.3f}")
            lines.append("| " + " | ".join(cells) + " |")
        if p.calibrated_for:
            lines += [
                "",
                "Calibrated for: " + ", ".join(f"{k}={v}" for k, v in p.calibrated_for.items()),
            ]
        return "\n".join(lines) + "\n"


def _fmt(x: float, digits: int) -> str:
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"
