"""Node statistics over a sliding time window of engine steps (GetStats, metrics)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from echo_core.stats import AcceptanceTotals
from echo_server.engine.cost_feedback import CostSnapshot
from echo_server.engine.report import StepReport


@dataclass(frozen=True, slots=True)
class StepSample:
    """What the window keeps of one engine step (its :class:`StepReport` reduced)."""

    seconds: float
    emitted: int  # tokens emitted (prefill first tokens included)
    decode_passes: int  # verify passes (0: a prefill-only step)
    acceptance: AcceptanceTotals  # request-steps, verified, accepted
    cost: CostSnapshot | None = None  # the verify-cost model after the step

    @classmethod
    def of(cls, report: StepReport, seconds: float) -> StepSample:
        return cls(seconds, report.emitted, len(report.passes), report.acceptance, report.cost)


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Load now, rates over the last ``window_s`` seconds (see GetStatsResponse)."""

    running: int = 0
    waiting: int = 0
    tokens_per_second: float = 0.0
    mean_accepted_length: float = 0.0
    draft_yield: float = 0.0
    verified_per_step: float = 0.0
    budget_k: int = 0
    steps_total: int = 0  # engine steps
    request_steps_total: int = 0  # decode request-steps (a step over B requests adds B)
    output_tokens_total: int = 0
    verified_total: int = 0
    accepted_total: int = 0
    window_s: float = 10.0
    gate_policy_version: str = "none"


class StatsWindow:
    """The steps of the last ``window_s`` seconds plus running totals.

    ``mean_accepted_length`` and ``draft_yield`` are :class:`AcceptanceTotals` over the window's
    request-steps; ``tokens_per_second = emitted / window_s``; ``verified_per_step`` is draft
    tokens verified per decode pass.
    """

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._steps: deque[tuple[float, StepSample]] = deque()
        self.steps_total = self.tokens_total = 0
        self.acceptance_total = AcceptanceTotals()

    def add(self, sample: StepSample, now: float) -> None:
        self._steps.append((now, sample))
        self.steps_total += 1
        self.tokens_total += sample.emitted
        self.acceptance_total += sample.acceptance

    def snapshot(
        self, now: float, *, running: int, waiting: int, budget_k: int, gate_version: str
    ) -> NodeSnapshot:
        while self._steps and now - self._steps[0][0] > self.window_s:
            self._steps.popleft()
        steps = [r for _, r in self._steps]
        window = sum((r.acceptance for r in steps), AcceptanceTotals())
        passes = sum(r.decode_passes for r in steps)
        total = self.acceptance_total
        return NodeSnapshot(
            running=running,
            waiting=waiting,
            tokens_per_second=sum(r.emitted for r in steps) / self.window_s,
            mean_accepted_length=window.mean_accepted_length,
            draft_yield=window.draft_yield,
            verified_per_step=window.verified / passes if passes else 0.0,
            budget_k=budget_k,
            steps_total=self.steps_total,
            request_steps_total=total.request_steps,
            output_tokens_total=self.tokens_total,
            verified_total=total.verified,
            accepted_total=total.accepted,
            window_s=self.window_s,
            gate_policy_version=gate_version,
        )
