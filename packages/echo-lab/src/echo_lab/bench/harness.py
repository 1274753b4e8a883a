"""One benchmark run: a closed loop of requests through one engine, measured and captured.

Closed loop at concurrency C: the first C prompts are submitted, and each time a request
finishes the next prompt is submitted, so (until the prompts run out) C requests are always in
flight. A run's clock counts only its engine's work (submits and steps), so several runs can be
stepped in turn (:func:`run_lockstep`) and each still reads as if it ran alone.

Every decode pass comes back in the step's report (a
:class:`~echo_server.engine.report.VerifiedStep`); once all requests of a pass have finished,
their outputs give the pass's continuations, its selection quality is evaluated
(:mod:`echo_lab.bench.oracle`) and the pass's pool is dropped, so memory stays bounded by the
passes still in flight. With ``record`` set, the steps are also kept as echo-trace/1 steps for the
simulator (:mod:`echo_lab.bench.traces`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from echo_core.sampling import SamplingParams
from echo_lab.bench.fairness import RequestTimes
from echo_lab.bench.intervals import percentile
from echo_lab.bench.metrics import (
    PHASES,
    RunAccumulator,
    RunResult,
    steady_rate,
    step_over_forward,
)
from echo_lab.bench.oracle import continuations, step_oracle
from echo_lab.sim.trace import RecordedStep
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


def run_lockstep(loops: Sequence[ClosedLoop]) -> list[RunOutput]:
    """Run several closed loops at once (one alone: a plain closed-loop run), one engine step
    each in turn (the order rotated every
    turn) until all are done: the machine's drift within a run lands on every loop alike, at the
    granularity of a step instead of a run. Each loop's times are its own steps' (its clock):
    its throughput and latencies are those of its engine's work, though the engines share the
    machine's caches step by step (alike for every loop: the order rotates). Every loop's engine
    and KV pool exist at once: N loops hold N times the memory of one."""
    step_in_turn([loop.step for loop in loops])
    return [loop.finish() for loop in loops]


def step_in_turn(steps: Sequence[Callable[[], bool]]) -> None:
    """Call every ``steps[i]`` once per turn until it returns False, turn t starting at the t-th
    still-live one (mod their number) and going round in the given order: with three live,
    turns go 0 1 2, 1 2 0, 2 0 1, 0 1 2, ... so each leads equally often and none steps twice in
    a row more often than another."""
    live = list(range(len(steps)))  # in the given order; only the starting point rotates
    turn = 0
    while live:
        k = turn % len(live)
        done = {i for i in live[k:] + live[:k] if not steps[i]()}
        live = [i for i in live if i not in done]
        turn += 1


class ClosedLoop:
    """One closed-loop run (module docstring), advanced one engine step at a time.

    The loop's clock counts only its own work: submitting requests and engine steps, wall
    (``perf_counter``) and process CPU time alike. The harness's own evaluation of finished
    steps (the hindsight oracle, trace capture) runs outside it, so a policy with larger draft
    pools is not charged for the bench's analysis of them.
    """

    def __init__(
        self,
        engine: Engine,
        prompts: Sequence[Prompt],
        concurrency: int,
        sampling: SamplingParams,
        labels: tuple[str, str],
        record: bool = False,
        on_request_done: Callable[[], None] | None = None,
    ) -> None:
        """``sampling`` applies to every request (a prompt's own ``max_tokens`` wins; request i
        gets seed ``sampling.seed + i`` when a seed is set); ``labels`` = (policy, workload)."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.engine, self.concurrency, self.sampling = engine, concurrency, sampling
        self.labels, self.record, self.on_request_done = labels, record, on_request_done
        self.queue = deque(enumerate(prompts))
        self.clock = _Clock()
        self.times = RequestTimes()
        self.sequences: dict[str, list[int]] = {}
        self.outputs: dict[str, list[int]] = {}
        self.prompt_ids: dict[str, list[int]] = {}
        self.pending: list[VerifiedStep] = []
        self.schedule_s = 0.0
        self.forward_s: float | None = 0.0  # None once a pass could not time its forward
        self.acc = RunAccumulator()
        self.recorded: list[RecordedStep] = []
        self.batch_sum = 0
        self.wall = self.cpu = 0.0  # the loop's own clock (class docstring)
        self.tokens = 0  # output tokens emitted so far
        self.steady: tuple[int, float] | None = None  # (tokens, clock) while prompts waited
        self._started = False

    def now(self) -> float:
        """The loop's clock: seconds of its own work so far."""
        return self.wall

    def _timed(self, work: Callable[[], None]) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        work()
        if self.engine.device.type == "cuda":  # queued kernels are this loop's work, not the next
            torch.cuda.synchronize(self.engine.device)
        self.wall += time.perf_counter() - t0
        self.cpu += time.process_time() - c0

    def _submit_next(self) -> None:
        i, p = self.queue.popleft()
        s = self.sampling
        seed = None if s.seed is None else s.seed + i
        params = replace(s, max_tokens=p.max_tokens or s.max_tokens, seed=seed)
        self.clock.submitted[p.prompt_id] = self.now()
        request = GenerationRequest(p.prompt_id, prompt=p.text, chat=p.chat, params=params)
        self._timed(lambda: self.engine.submit(request))

    def step(self) -> bool:
        """One engine step (the first call also submits the first C prompts); False once every
        request has finished (nothing was stepped)."""
        engine = self.engine
        if not self._started:
            self._started = True
            engine.metrics.reset()
            for _ in range(min(self.concurrency, len(self.queue))):
                self._submit_next()
        if not engine.has_work():
            return False
        waiting = bool(self.queue)  # every slot is busy through this step
        reports = []
        self._timed(lambda: reports.append(engine.step()))
        report, now = reports[0], self.now()
        for ev in report.events:
            if ev.error is not None:
                raise RequestError(f"{ev.request_id}: {ev.error}")
            self.clock.emitted(ev.request_id, len(ev.token_ids), now)
            self.times.emitted(ev.request_id, len(ev.token_ids), now)
            self.tokens += len(ev.token_ids)
            if ev.finish_reason is None:
                continue
            state = engine.pop_finished(ev.request_id)
            self.sequences[ev.request_id] = state.prompt_ids + state.output_ids
            self.outputs[ev.request_id] = list(state.output_ids)
            self.prompt_ids[ev.request_id] = list(state.prompt_ids)
            if self.on_request_done is not None:
                self.on_request_done()
            if self.queue:
                self._submit_next()
        if waiting:
            self.steady = (self.tokens, now)
        self.batch_sum += report.batch
        self.schedule_s += sum(p.schedule_s for p in report.passes)
        self.pending.extend(report.passes)
        for verified in report.passes:
            self.times.verified(verified.request_ids, verified.tree.nodes_per_request().tolist())
            if self.forward_s is not None:
                fwd = verified.forward_s
                self.forward_s = None if fwd is None else self.forward_s + fwd
        self._settle()
        return True

    def _settle(self) -> None:
        """Evaluate the passes whose requests have all finished (outside the loop's clock)."""
        still = []
        for step in self.pending:
            if not all(r in self.sequences for r in step.request_ids):
                still.append(step)
                continue
            seqs = [self.sequences[r] for r in step.request_ids]
            target = continuations(
                seqs, step.root_positions.tolist(), max(step.pool.max_depth(), 1)
            )
            hind = step_oracle(step.pool, step.keep, target, step.max_nodes)
            self.acc.add(step, hind)
            if self.record:
                self.recorded.append(
                    RecordedStep(
                        step.pool,
                        target,
                        step.max_nodes,
                        tuple(f"{r}@c{self.concurrency}" for r in step.request_ids),  # per run
                        tuple(step.request_steps.tolist()),
                    )
                )
        self.pending[:] = still

    def finish(self) -> RunOutput:
        """The run's row; call once :meth:`step` has returned False."""
        if not self._started or self.queue or self.engine.has_work():
            raise RuntimeError("the loop still has requests in flight or waiting")
        if self.pending:
            raise RuntimeError(f"{len(self.pending)} captured steps never settled")
        engine, wall, cpu, outputs = self.engine, self.wall, self.cpu, self.outputs
        metrics = engine.metrics
        steps = max(metrics.steps, 1)
        phase = dict(metrics.phase_seconds)
        phase["draft"] = phase.get("draft", 0.0) - self.schedule_s
        phase["schedule"] = self.schedule_s
        phase["prefill"] = phase.get("prefill", 0.0) + max(wall - sum(phase.values()), 0.0)
        tokens = sum(len(o) for o in outputs.values())
        ys = self.acc.step_yields
        clock, acc = self.clock, self.acc
        result = RunResult(
            policy=self.labels[0],
            workload=self.labels[1],
            concurrency=self.concurrency,
            requests=len(outputs),
            output_tokens=tokens,
            wall_s=wall,
            tokens_per_s=tokens / wall if wall > 0 else 0.0,
            steady_tokens_per_s=steady_rate(self.steady),
            cpu_s=cpu,
            tokens_per_cpu_s=tokens / cpu if cpu > 0 else 0.0,
            mean_batch=self.batch_sum / steps,
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
            longest_passed_over=self.times.longest_passed_over(),
            step_over_forward=step_over_forward(phase, self.forward_s),
        )
        return RunOutput(result, outputs, self.prompt_ids, acc, self.recorded, self.times.tpot())
