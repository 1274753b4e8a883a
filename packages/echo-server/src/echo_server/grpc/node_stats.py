"""Node statistics over a sliding time window of engine steps (GetStats, metrics)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepReport:
    """One engine step."""

    seconds: float
    batch: int  # requests in the decode batch
    emitted: int  # tokens emitted (prefill first tokens included)
    verified: int  # draft tokens verified
    accepted: int  # of which accepted


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
    steps_total: int = 0
    output_tokens_total: int = 0
    verified_total: int = 0
    accepted_total: int = 0
    window_s: float = 10.0
    gate_policy_version: str = "none"


class StatsWindow:
    """The steps of the last ``window_s`` seconds plus running totals.

    ``mean_accepted_length = (accepted + request-steps) / request-steps`` (one bonus token per
    request per step), ``draft_yield = accepted / verified``, ``tokens_per_second = emitted /
    window_s``.
    """

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._steps: deque[tuple[float, StepReport]] = deque()
        self.steps_total = self.tokens_total = self.verified_total = self.accepted_total = 0

    def add(self, report: StepReport, now: float) -> None:
        self._steps.append((now, report))
        self.steps_total += 1
        self.tokens_total += report.emitted
        self.verified_total += report.verified
        self.accepted_total += report.accepted

    def snapshot(
        self, now: float, *, running: int, waiting: int, budget_k: int, gate_version: str
    ) -> NodeSnapshot:
        while self._steps and now - self._steps[0][0] > self.window_s:
            self._steps.popleft()
        steps = [r for _, r in self._steps]
        request_steps = sum(r.batch for r in steps)
        verified, accepted = sum(r.verified for r in steps), sum(r.accepted for r in steps)
        return NodeSnapshot(
            running=running,
            waiting=waiting,
            tokens_per_second=sum(r.emitted for r in steps) / self.window_s,
            mean_accepted_length=(accepted + request_steps) / request_steps
            if request_steps
            else 0.0,
            draft_yield=accepted / verified if verified else 0.0,
            verified_per_step=verified / len(steps) if steps else 0.0,
            budget_k=budget_k,
            steps_total=self.steps_total,
            output_tokens_total=self.tokens_total,
            verified_total=self.verified_total,
            accepted_total=self.accepted_total,
            window_s=self.window_s,
            gate_policy_version=gate_version,
        )
