"""Every policy side by side on the same prompts, at every concurrency, in one process.

For each workload and concurrency the reference ``plain`` runs first, then every other policy
on the same prompts with the same sampling; ``speedup`` is a policy's tokens/s over plain's from
that same (workload, concurrency). Under greedy decoding every policy's outputs must equal
plain's token for token (speculative decoding is lossless); any difference is recorded in the
run's ``mismatches`` (with the reference's top-2 logit gap at the first differing position when
a ``gap`` probe is given: a gap near 0 is a floating-point near-tie, anything else a bug) and
makes the suite fail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from echo_core.sampling import SamplingParams
from echo_scheduler.trace import RecordedStep
from echo_server.bench.harness import RunOutput, run_closed_loop
from echo_server.bench.metrics import RunAccumulator, RunResult
from echo_server.bench.workloads import Workload
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
    total = sum(len(w.prompts) for w in workloads) * len(spec.concurrency) * len(policies)
    bar: Any = tqdm(total=total, unit="req", disable=not progress, dynamic_ncols=True)
    result = SuiteResult()
    try:
        for workload in workloads:
            for conc in spec.concurrency:
                reference: RunOutput | None = None
                for policy in policies:
                    bar.set_description(f"{workload.name} c={conc} {policy}")
                    out = run_closed_loop(
                        factory(policy, conc),
                        workload.prompts,
                        conc,
                        sampling,
                        (policy, workload.name),
                        record=policy == spec.trace_policy,
                        on_request_done=lambda: bar.update(1),
                    )
                    if reference is None:
                        reference = out
                    r = out.result
                    base = reference.result.tokens_per_s
                    r.speedup = r.tokens_per_s / base if base > 0 else None
                    base_cpu = reference.result.tokens_per_cpu_s
                    r.speedup_cpu = r.tokens_per_cpu_s / base_cpu if base_cpu > 0 else None
                    if spec.greedy:
                        r.mismatches = compare_outputs(reference, out, gap)
                        r.outputs_match = not r.mismatches
                    result.runs.append(r)
                    if on_run is not None:
                        on_run(r)
                    result.accumulators[(policy, workload.name, conc)] = out.accumulator
                    if out.recorded:
                        result.traces.setdefault(workload.name, []).extend(out.recorded)
    finally:
        bar.close()
    return result
