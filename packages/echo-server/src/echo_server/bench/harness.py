"""One benchmark run: a closed loop of requests through one engine, measured and captured.

Closed loop at concurrency C: the first C prompts are submitted, and each time a request
finishes the next prompt is submitted, so (until the prompts run out) C requests are always in
flight. Every decode pass comes back in the step's report (a
:class:`~echo_server.engine.report.VerifiedStep`); once all requests of a pass have finished,
their outputs give the pass's continuations, its selection quality is evaluated
(:mod:`echo_server.bench.oracle`) and the pass's pool is dropped, so memory stays bounded by the
passes still in flight. With ``record`` set, the steps are also kept as echo-trace/1 steps for the
simulator (:mod:`echo_server.bench.traces`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from echo_core.sampling import SamplingParams
from echo_scheduler.trace import RecordedStep
from echo_server.bench.fairness import RequestTimes
from echo_server.bench.metrics import (
    PHASES,
    RunAccumulator,
    RunResult,
    percentile,
    step_over_forward,
)
from echo_server.bench.oracle import continuations, step_oracle
from echo_server.engine import Engine, GenerationRequest
from echo_server.engine.report import VerifiedStep
from echo_server.engine.request import RequestError
from echo_server.prompts import Prompt


@dataclass(slots=True)
class RunOutput:
    """A run's row plus what the suite needs beyond it."""

    result: RunResult
    outputs: dict[str, list[int]]  # prompt id -> output token ids
    prompt_ids: dict[str, list[int]]  # prompt id -> prompt token ids
    accumulator: RunAccumulator
    recorded: list[RecordedStep] = field(default_factory=list)
    request_tpot: dict[str, float] = field(default_factory=dict)  # bench/fairness.py


@dataclass(slots=True)
class _Clock:
    """Per-request emission times for the latency samples."""

    submitted: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    per_token: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)

    def emitted(self, request_id: str, tokens: int, now: float) -> None:
        if tokens == 0:
            return
        if request_id not in self.last:
            self.ttft.append(now - self.submitted[request_id])
        else:
            gap = now - self.last[request_id]
            self.per_token.extend([gap / tokens] * tokens)
        self.last[request_id] = now


def run_closed_loop(
    engine: Engine,
    prompts: Sequence[Prompt],
    concurrency: int,
    sampling: SamplingParams,
    labels: tuple[str, str],
    record: bool = False,
    on_request_done: Callable[[], None] | None = None,
) -> RunOutput:
    """Serve ``prompts`` through ``engine`` with ``concurrency`` requests in flight.

    ``sampling`` applies to every request (a prompt's own ``max_tokens`` wins; request i gets
    seed ``sampling.seed + i`` when a seed is set); ``labels`` = (policy, workload).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    queue = deque(enumerate(prompts))
    clock = _Clock()
    times = RequestTimes()
    sequences: dict[str, list[int]] = {}
    outputs: dict[str, list[int]] = {}
    prompt_ids: dict[str, list[int]] = {}
    pending: list[VerifiedStep] = []
    schedule_s = 0.0
    forward_s: float | None = 0.0  # None once a pass could not time its forward (not a CPU)
    acc = RunAccumulator()
    recorded: list[RecordedStep] = []
    batch_sum = 0

    def submit_next() -> None:
        i, p = queue.popleft()
        seed = None if sampling.seed is None else sampling.seed + i
        params = replace(sampling, max_tokens=p.max_tokens or sampling.max_tokens, seed=seed)
        clock.submitted[p.prompt_id] = time.perf_counter()
        engine.submit(GenerationRequest(p.prompt_id, prompt=p.text, chat=p.chat, params=params))

    def settle() -> None:
        still = []
        for step in pending:
            if not all(r in sequences for r in step.request_ids):
                still.append(step)
                continue
            seqs = [sequences[r] for r in step.request_ids]
            target = continuations(
                seqs, step.root_positions.tolist(), max(step.pool.max_depth(), 1)
            )
            hind = step_oracle(step.pool, step.keep, target, step.max_nodes)
            acc.add(step, hind)
            if record:
                recorded.append(
                    RecordedStep(
                        step.pool,
                        target,
                        step.max_nodes,
                        tuple(f"{r}@c{concurrency}" for r in step.request_ids),  # per run
                        tuple(step.request_steps.tolist()),
                    )
                )
        pending[:] = still

    engine.metrics.reset()
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(min(concurrency, len(queue))):
        submit_next()
    while engine.has_work():
        report = engine.step()
        now = time.perf_counter()
        for ev in report.events:
            if ev.error is not None:
                raise RequestError(f"{ev.request_id}: {ev.error}")
            clock.emitted(ev.request_id, len(ev.token_ids), now)
            times.emitted(ev.request_id, len(ev.token_ids), now)
            if ev.finish_reason is None:
                continue
            state = engine.pop_finished(ev.request_id)
            sequences[ev.request_id] = state.prompt_ids + state.output_ids
            outputs[ev.request_id] = list(state.output_ids)
            prompt_ids[ev.request_id] = list(state.prompt_ids)
            if on_request_done is not None:
                on_request_done()
            if queue:
                submit_next()
        batch_sum += report.batch
        schedule_s += sum(p.schedule_s for p in report.passes)
        pending.extend(report.passes)
        for verified in report.passes:
            times.verified(verified.request_ids, verified.tree.nodes_per_request().tolist())
            if forward_s is not None:
                forward_s = None if verified.forward_s is None else forward_s + verified.forward_s
        settle()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if pending:
        raise RuntimeError(f"{len(pending)} captured steps never settled")

    metrics = engine.metrics
    steps = max(metrics.steps, 1)
    phase = dict(metrics.phase_seconds)
    phase["draft"] = phase.get("draft", 0.0) - schedule_s
    phase["schedule"] = schedule_s
    phase["prefill"] = phase.get("prefill", 0.0) + max(wall - sum(phase.values()), 0.0)
    tokens = sum(len(o) for o in outputs.values())
    ys = acc.step_yields
    result = RunResult(
        policy=labels[0],
        workload=labels[1],
        concurrency=concurrency,
        requests=len(outputs),
        output_tokens=tokens,
        wall_s=wall,
        tokens_per_s=tokens / wall if wall > 0 else 0.0,
        cpu_s=cpu,
        tokens_per_cpu_s=tokens / cpu if cpu > 0 else 0.0,
        mean_batch=batch_sum / steps,
        steps=metrics.steps,
        mean_accepted_length=acc.mean_accepted_length,
        draft_yield=acc.draft_yield,
        verified_per_step=acc.verified / steps,
        budget_per_step=acc.budget / steps,
        selection=acc.selection,
        latency_p50_ms=1e3 * percentile(clock.per_token, 50),
        latency_p99_ms=1e3 * percentile(clock.per_token, 99),
        ttft_p50_ms=1e3 * percentile(clock.ttft, 50),
        phase_ms_per_step={p: 1e3 * phase.get(p, 0.0) / steps for p in PHASES},
        draft_yield_quartiles=(percentile(ys, 25), percentile(ys, 50), percentile(ys, 75)),
        longest_passed_over=times.longest_passed_over(),
        step_over_forward=step_over_forward(phase, forward_s),
    )
    return RunOutput(result, outputs, prompt_ids, acc, recorded, times.tpot())
