"""Every policy side by side on the same prompts, at every concurrency, in one process.

For each workload and concurrency every policy (the reference ``plain`` included) runs the same
prompts with the same sampling in ``rounds`` interleaved rounds, the order rotated by one policy
each round, so the machine's drift lands on every arm. With ``lockstep`` (the default) a round
runs every policy's engine at once, one step each in turn
(:func:`~echo_lab.bench.harness.run_lockstep`), so drift is shared step by step rather than
run by run; each engine is timed on its own steps only. A policy's ``speedup`` is the median over
rounds of ``its tokens/s / plain's tokens/s`` in that round, with a 95% t-interval over the
rounds (``speedup_ci95``, :func:`echo_lab.bench.intervals.round_ratio`); its reported row is
the round closest to that median. Per-request speedups (:mod:`echo_lab.bench.fairness`)
give ``request_speedup_p10`` and ``request_speedup_min``, each the median over rounds. Under
greedy decoding every policy's outputs must equal plain's token for token (speculative decoding
is lossless); any difference is recorded in the run's ``mismatches`` (with the reference's top-2
logit gap at the first differing position when a ``gap`` probe is given: a gap near 0 is a
floating-point near-tie, anything else a bug) and makes the suite fail.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from echo_core.sampling import SamplingParams
from echo_lab.bench.fairness import request_speedups
from echo_lab.bench.harness import ClosedLoop, RunOutput, run_lockstep
from echo_lab.bench.intervals import percentile, rotated, round_ratio
from echo_lab.bench.metrics import RunAccumulator, RunResult
from echo_lab.bench.workloads import Workload
from echo_lab.sim.trace import RecordedStep
from echo_server.engine import Engine

REFERENCE = "plain"
EngineFactory = Callable[[str, int], Engine]
"""(policy CLI name, concurrency) -> a fresh engine for one run."""
GapProbe = Callable[[list[int], list[int]], float]
"""(prompt ids, output prefix) -> the reference's top-2 logit gap for the next token."""


@dataclass(frozen=True, slots=True)
class SuiteSpec:
    policies: tuple[str, ...]  # CLI names; plain is added first if missing
    concurrency: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    seed: int = 0
    trace_policy: str | None = None  # keep this policy's steps as simulator traces
    rounds: int = 3  # interleaved rounds per (workload, concurrency)
    lockstep: bool = True  # a round steps every policy's engine in turn (else run after run)

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")

    @property
    def ordered_policies(self) -> tuple[str, ...]:
        rest = tuple(p for p in self.policies if p != REFERENCE)
        return (REFERENCE, *rest)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(slots=True)
class SuiteResult:
    runs: list[RunResult] = field(default_factory=list)
    accumulators: dict[tuple[str, str, int], RunAccumulator] = field(default_factory=dict)
    traces: dict[str, list[RecordedStep]] = field(default_factory=dict)

    @property
    def failures(self) -> list[str]:
        return [
            f"{r.policy} on {r.workload} at concurrency {r.concurrency}: "
            f"{len(r.mismatches)} outputs differ from plain decoding"
            for r in self.runs
            if r.outputs_match is False
        ]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (or the shorter length); None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(
    reference: RunOutput, run: RunOutput, gap: GapProbe | None = None
) -> list[dict[str, object]]:
    """One entry per prompt whose output differs from the reference's."""
    out: list[dict[str, object]] = []
    for pid, ref in reference.outputs.items():
        got = run.outputs.get(pid, [])
        i = first_difference(ref, got)
        if i is None:
            continue
        entry: dict[str, object] = {"prompt_id": pid, "index": i}
        if gap is not None and i < len(ref):
            entry["reference_top2_gap"] = gap(reference.prompt_ids[pid], ref[:i])
        out.append(entry)
    return out


def run_suite(
    factory: EngineFactory,
    workloads: Sequence[Workload],
    spec: SuiteSpec,
    gap: GapProbe | None = None,
    progress: bool = True,
    on_run: Callable[[RunResult], None] | None = None,
) -> SuiteResult:
    """Run every (workload, concurrency, policy) combination; see the module docstring.

    ``on_run`` sees every finished row (the CLI appends it to a JSONL file, so a long run that
    dies late keeps what it measured)."""
    sampling = SamplingParams(
        temperature=spec.temperature,
        max_tokens=spec.max_tokens,
        seed=None if spec.greedy else spec.seed,
    )
    policies = spec.ordered_policies
    total = (
        sum(len(w.prompts) for w in workloads) * len(spec.concurrency) * len(policies) * spec.rounds
    )
    bar: Any = tqdm(total=total, unit="req", disable=not progress, dynamic_ncols=True)
    result = SuiteResult()
    try:
        for workload in workloads:
            for conc in spec.concurrency:
                cell: dict[str, list[RunOutput]] = {p: [] for p in policies}
                for r in range(spec.rounds):
                    order = rotated(list(policies), r)
                    outs = _round(factory, workload, conc, order, sampling, spec, r, bar)
                    for policy, out in zip(order, outs, strict=True):
                        cell[policy].append(out)
                for policy in policies:
                    _settle_cell(result, cell, policy, spec, gap, on_run)
    finally:
        bar.close()
    return result


def _round(
    factory: EngineFactory,
    workload: Workload,
    conc: int,
    order: Sequence[str],
    sampling: SamplingParams,
    spec: SuiteSpec,
    r: int,
    bar: Any,
) -> list[RunOutput]:
    """Round ``r`` of one cell: every policy of ``order`` in lockstep, or one after another."""

    def loop(policy: str) -> ClosedLoop:
        return ClosedLoop(
            factory(policy, conc),
            workload.prompts,
            conc,
            sampling,
            (policy, workload.name),
            record=policy == spec.trace_policy and r == 0,
            on_request_done=lambda: bar.update(1),
        )

    if spec.lockstep:
        bar.set_description(f"{workload.name} c={conc} round {r + 1}")
        return run_lockstep([loop(p) for p in order])
    outs = []
    for policy in order:
        bar.set_description(f"{workload.name} c={conc} {policy} round {r + 1}")
        outs.extend(run_lockstep([loop(policy)]))
    return outs


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def _settle_cell(
    result: SuiteResult,
    cell: dict[str, list[RunOutput]],
    policy: str,
    spec: SuiteSpec,
    gap: GapProbe | None,
    on_run: Callable[[RunResult], None] | None,
) -> None:
    """One policy's rounds in a (workload, concurrency) cell -> its row, with speedups."""
    reference, runs = cell[REFERENCE], cell[policy]
    pairs = list(zip(reference, runs, strict=True))
    wall = [out.result.tokens_per_s / ref.result.tokens_per_s for ref, out in pairs]
    cpu = [out.result.tokens_per_cpu_s / ref.result.tokens_per_cpu_s for ref, out in pairs]
    speed = round_ratio(wall)
    median_round = min(range(len(wall)), key=lambda i: abs(wall[i] - speed.ratio))
    out = runs[median_round]
    r = out.result
    r.speedup, r.speedup_ci95, r.speedup_rounds = speed.ratio, speed.ci95, speed.rounds
    r.speedup_cpu = round_ratio(cpu).ratio
    steady = [
        _ratio(out.result.steady_tokens_per_s, ref.result.steady_tokens_per_s) for ref, out in pairs
    ]
    if all(x is not None for x in steady):
        steady_speed = round_ratio([x for x in steady if x is not None])
        r.steady_speedup, r.steady_speedup_ci95 = steady_speed.ratio, steady_speed.ci95
    per_round = [request_speedups(ref.request_tpot, run.request_tpot) for ref, run in pairs]
    if all(per_round):
        r.request_speedup_p10 = statistics.median(percentile(s, 10) for s in per_round)
        r.request_speedup_min = statistics.median(s[0] for s in per_round)
    if spec.greedy:
        r.mismatches = [m for run in runs for m in compare_outputs(reference[0], run, gap)]
        r.outputs_match = not r.mismatches
    result.runs.append(r)
    if on_run is not None:
        on_run(r)
    result.accumulators[(policy, r.workload, r.concurrency)] = out.accumulator
    recorded = [step for run in runs for step in run.recorded]
    if recorded:
        result.traces.setdefault(r.workload, []).extend(recorded)
