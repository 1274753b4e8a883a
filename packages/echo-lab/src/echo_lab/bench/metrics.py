"""What one benchmark run measures, accumulated step by step and summarised into a row.

Definitions (per run = one policy on one workload at one concurrency):

- ``tokens_per_s`` = output tokens of all requests / wall time from the first submit to the last
  finish (prefill included);
- ``steady_tokens_per_s`` = output tokens emitted by the last step that began with a prompt
  still waiting / the run's clock at the end of that step (:func:`steady_rate`): throughput
  while all C slots were busy, as in a server whose queue never empties. It leaves out the
  drain, when the last C requests finish one by one and the batch runs emptier (a policy
  whose requests finish apart drains longer than plain decoding, whose same-length requests
  finish together). ``None`` when no step began with a prompt waiting (prompts <= C);
- ``tokens_per_cpu_s`` = output tokens / CPU seconds of this process over the run: on a shared
  machine, an estimate of tokens/s on an otherwise idle core (with one torch thread, CPU time
  equals wall time when nothing else runs); ``speedup_cpu`` is its ratio to plain's;
- ``mean_accepted_length`` = (accepted draft tokens + one bonus per request-step) / request-steps
  (1.0 = plain decoding); ``draft_yield`` = accepted / verified draft tokens;
- ``verified_per_step`` = draft tokens verified per engine step (what the budget K caps);
- ``latency_p50_ms`` / ``latency_p99_ms``: per-token latency as a streaming client sees it; an
  event that brings n tokens after a gap of g since the request's previous event counts n
  samples of g / n (the first token's wait is ``ttft`` instead);
- ``phase_ms_per_step``: mean wall time per decode step of draft (drafter only), schedule (the
  policy's own methods), verify, accept, commit, emit; ``prefill`` is the rest of the step time
  (admission and prefill of new requests);
- ``request_speedup_p10`` / ``request_speedup_min``: per request, plain's time per output token
  over this run's in the same round; the 10th percentile and the minimum over requests (median
  over rounds); ``longest_passed_over``: the most drafted steps in a row in which one request got
  no draft row (:mod:`echo_lab.bench.fairness`);
- ``step_over_forward`` = decode-step wall time (every phase but prefill) / wall time of the
  target model's own forward + logits inside those steps' verify passes (CPU only, else
  ``None``): 1.0 would be a step that costs exactly the model over the rows it verifies; what is
  above it is drafting, scheduling, verify preparation, acceptance, commit and emit;
- ``selection`` (:mod:`echo_lab.bench.oracle`): accepted draft tokens / the most that as many
  verified rows could have accepted from the same pools, ``None`` when no step verified a draft
  row (plain decoding).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor

from echo_core.stats import AcceptanceTotals
from echo_lab.bench.oracle import StepOracle
from echo_server.engine.report import VerifiedStep

PHASES = ("prefill", "draft", "schedule", "verify", "accept", "commit", "emit")
CONFIDENCE_BINS = 20
HIST_DEPTHS = 8
"""Confidence histograms cover depths 1..HIST_DEPTHS; deeper nodes join the last depth."""


@dataclass(slots=True)
class RunAccumulator:
    """Running totals of one run, fed with every step once its requests have finished."""

    steps: int = 0
    acceptance: AcceptanceTotals = field(default_factory=AcceptanceTotals)
    best: int = 0  # sum over steps of StepOracle.best
    budget: int = 0
    schedule_s: float = 0.0
    step_yields: list[float] = field(default_factory=list)
    # [HIST_DEPTHS, 2, CONFIDENCE_BINS] int64: verified nodes by depth, (rejected, accepted),
    # path probability bin
    confidence: Tensor = field(
        default_factory=lambda: torch.zeros(HIST_DEPTHS, 2, CONFIDENCE_BINS, dtype=torch.int64)
    )

    def add(self, step: VerifiedStep, hind: StepOracle) -> None:
        acc, ver = step.stats.total_accepted, step.stats.total_verified
        self.steps += 1
        self.acceptance += step.stats.totals
        self.best += hind.best
        self.budget += step.budget
        self.schedule_s += step.schedule_s
        if ver:
            self.step_yields.append(acc / ver)
            self.confidence += confidence_histogram(step, hind.hit)

    @property
    def mean_accepted_length(self) -> float:
        return self.acceptance.mean_accepted_length

    @property
    def draft_yield(self) -> float:
        return self.acceptance.draft_yield

    @property
    def verified(self) -> int:
        return self.acceptance.verified

    @property
    def selection(self) -> float | None:
        return self.acceptance.accepted / self.best if self.best else None


def step_over_forward(phase_s: Mapping[str, float], forward_s: float | None) -> float | None:
    """``sum(phase_s[p] for p != "prefill") / forward_s`` (module docstring); None when the
    forward was not timed or took no time."""
    if forward_s is None or forward_s <= 0.0:
        return None
    return sum(sec for name, sec in phase_s.items() if name != "prefill") / forward_s


def confidence_histogram(step: VerifiedStep, hit: Tensor) -> Tensor:
    """[HIST_DEPTHS, 2, CONFIDENCE_BINS] counts of verified nodes by depth, accepted (index 1)
    or rejected (0), and path probability ``exp(path_logprob)`` in equal-width bins of [0, 1]."""
    keep = step.keep
    depth = (step.pool.depth[keep] - 1).clamp(max=HIST_DEPTHS - 1)
    prob = step.pool.path_logprob[keep].exp().clamp(0.0, 1.0)
    bins = (prob * CONFIDENCE_BINS).long().clamp(max=CONFIDENCE_BINS - 1)
    accepted = hit[keep].long()
    flat = (depth * 2 + accepted) * CONFIDENCE_BINS + bins
    counts = torch.bincount(flat, minlength=HIST_DEPTHS * 2 * CONFIDENCE_BINS)
    return counts.view(HIST_DEPTHS, 2, CONFIDENCE_BINS)


def pooled_confidence(
    accumulators: Mapping[tuple[str, str, int], RunAccumulator],
) -> dict[str, Tensor]:
    """Per policy, the confidence histograms of all its runs summed (policies with data only)."""
    out: dict[str, Tensor] = {}
    for (policy, _, _), acc in accumulators.items():
        out[policy] = out[policy] + acc.confidence if policy in out else acc.confidence.clone()
    return {p: h for p, h in out.items() if int(h.sum())}


def steady_rate(steady: tuple[int, float] | None) -> float | None:
    """``tokens / seconds`` of a (tokens, seconds) mark while every slot was busy (module
    docstring: ``steady_tokens_per_s``); None without a mark or with no time in it."""
    if steady is None or steady[1] <= 0:
        return None
    return steady[0] / steady[1]


@dataclass(slots=True)
class RunResult:
    """One row of the benchmark (JSON ``runs[i]``; docs/BENCHMARKS.md documents every field)."""

    policy: str
    workload: str
    concurrency: int
    requests: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float
    steady_tokens_per_s: float | None  # while every slot was busy (steady_rate)
    cpu_s: float
    tokens_per_cpu_s: float
    mean_batch: float
    steps: int
    mean_accepted_length: float
    draft_yield: float
    verified_per_step: float
    budget_per_step: float
    selection: float | None
    latency_p50_ms: float
    latency_p99_ms: float
    ttft_p50_ms: float
    phase_ms_per_step: dict[str, float]
    draft_yield_quartiles: tuple[float, float, float]
    longest_passed_over: int = 0  # drafted steps in a row one request got no row (fairness.py)
    step_over_forward: float | None = None  # decode step / the model's forward in it (CPU)
    speedup: float | None = None  # median over interleaved rounds of plain's wall / this run's
    speedup_ci95: tuple[float, float] | None = None  # t-interval over rounds (bench.intervals)
    speedup_rounds: tuple[float, ...] = ()
    speedup_cpu: float | None = None  # the same median, in CPU time
    steady_speedup: float | None = None  # the same median of steady_tokens_per_s ratios
    steady_speedup_ci95: tuple[float, float] | None = None
    request_speedup_p10: float | None = None  # median over rounds of the p10 over requests of
    request_speedup_min: float | None = None  # tpot(plain) / tpot(this), and of the minimum
    outputs_match: bool | None = None
    mismatches: list[dict[str, object]] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {f.name: _finite(getattr(self, f.name)) for f in fields(self)}


def _finite(value: object) -> object:
    """JSON has no NaN: NaN -> None, recursively through lists, tuples and dicts."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else round(value, 6)
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value
