"""Engine metrics: running totals over the step reports an engine returned.

- ``draft_yield`` and ``mean_accepted_length``: :class:`~echo_core.stats.AcceptanceTotals` over
  every decode request-step (1.0 mean accepted length = plain decoding);
- ``verified_per_step``: draft tokens verified per decode pass (what the budget K caps);
- ``phase_seconds``: wall time per phase of :data:`~echo_server.engine.report.PHASES`.

:class:`EngineMetrics` is a consumer of :class:`~echo_server.engine.report.StepReport` like any
other (the engine feeds its own copy; gRPC and the bench read reports directly).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from echo_core.stats import StatsAccumulator
from echo_server.engine.report import PHASES, StepReport


@dataclass(slots=True)
class EngineMetrics:
    """Running totals over the engine's life (reset with :meth:`reset`)."""

    steps: int = 0  # decode passes
    emitted_tokens: int = 0
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    acceptance: StatsAccumulator = field(default_factory=StatsAccumulator)

    def add(self, report: StepReport) -> None:
        """Fold one step's report into the totals."""
        self.steps += len(report.passes)
        self.emitted_tokens += report.emitted
        for phase, sec in report.phase_s.items():
            self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + sec
        for verified in report.passes:
            self.acceptance.add(verified.stats)

    @property
    def verified_per_step(self) -> float:
        return self.acceptance.verified / self.steps if self.steps else 0.0

    def summary(self) -> dict[str, float]:
        """Flat numbers for logs and stats endpoints."""
        out = {
            "steps": float(self.steps),
            "emitted_tokens": float(self.emitted_tokens),
            "draft_yield": self.acceptance.draft_yield,
            "mean_accepted_length": self.acceptance.mean_accepted_length,
            "verified_per_step": self.verified_per_step,
        }
        out.update({f"{k}_s": v for k, v in self.phase_seconds.items()})
        return out

    def reset(self) -> None:
        self.steps = 0
        self.emitted_tokens = 0
        self.phase_seconds = dict.fromkeys(PHASES, 0.0)
        self.acceptance = StatsAccumulator()
