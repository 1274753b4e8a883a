"""The engine loop: continuous batching with speculative steps under any echo-scheduler policy.

One call of :meth:`Engine.step` is one decode step of the design card's data path (README.md,
"Where a decode step happens"), returning a :class:`~echo_server.engine.report.StepReport`.
Before the decode phases, waiting requests whose worst case fits the KV pool are admitted and
prefilled, in chunks of at most ``prefill_chunk`` prompt rows per step if set (admission.py,
chunking.py). Then the six phases of a decode step:

1. draft     the policy driver: the drafter expands depth by depth, the policy gating between
             depths, then selects <= K nodes over the whole batch -> SuperTree (draft_source.py)
2. allocate  fresh KV slots for every request's root + tree rows                  (verify.py)
3. verify    one target forward over those rows                                   (verify.py)
4. accept    greedy, or lossless stochastic tree acceptance                   (acceptance.py)
5. commit    keep the KV of roots and accepted nodes, roll back the rest       (kv/commit.py)
6. emit      stream tokens; finish on EOS / max_tokens / stop strings             (emit.py)

K and the step's prices come from one budget chain (:mod:`echo_scheduler.budget`, built by
:mod:`~echo_server.engine.budget`): fixed or the measured knee, capped by a controller's lease,
then the elastic floor. Phases 1-4 change no request state; a failure there frees its KV slots
and the step is retried per request, so only the culprit fails (:meth:`Engine._decode_isolated`).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterator, Sequence

import structlog
import torch

from echo_gating.policy import GatePolicy
from echo_scheduler.elastic import ElasticFloor
from echo_scheduler.interface import Policy, StepOutcome
from echo_server.drafting.base import Drafter
from echo_server.engine.acceptance import first_token
from echo_server.engine.admission import Admission
from echo_server.engine.budget import engine_budget
from echo_server.engine.chunking import chunk_rows
from echo_server.engine.config import EngineConfig
from echo_server.engine.cost_feedback import CostFeedback
from echo_server.engine.emit import apply_new_tokens
from echo_server.engine.metrics import EngineMetrics
from echo_server.engine.report import StepReport, StepTimer, VerifiedStep
from echo_server.engine.request import (
    FinishReason,
    GenerationRequest,
    Phase,
    RequestError,
    RequestState,
    StepEvent,
)
from echo_server.engine.speculate import Speculation, SpeculationError, speculate
from echo_server.engine.verify import feedback, kv_handle, prefill
from echo_server.kv.commit import commit_verified, kept_rows
from echo_server.kv.pool import KVPool
from echo_server.model.llama import LlamaModel
from echo_server.model.tokenizer import Tokenizer

log = structlog.get_logger(__name__)


class Engine:
    """Serves generation requests with one model, one drafter and one policy."""

    def __init__(
        self,
        model: LlamaModel,
        tokenizer: Tokenizer,
        policy: Policy,
        drafter: Drafter,
        config: EngineConfig | None = None,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.policy, self.drafter = policy, drafter
        self.config = cfg = config or EngineConfig()
        mc, dtype, device = model.config, model.dtype, model.device
        self.device = device  # every per-step tensor of the engine lives here, except:
        # the policy's pool (caps, drafted candidates, selection) lives on the host unless
        # cfg.policy_on_host is False: on an H200 ECHO's ranking on device tensors took 3-17 ms
        # per step (22-90 syncs), on one host thread 0.6-2.8 ms (docs/lab/2026-12-04.md)
        self.policy_device = torch.device("cpu") if cfg.policy_on_host else device
        self.kv = KVPool(mc, cfg.kv_slots, cfg.max_batch, cfg.max_context, dtype, device)
        self.budget = engine_budget(cfg.budget, cfg.elastic, model, cfg.profile_cache)
        slack = self.budget.local_k(1) + cfg.max_batch  # K + one root per request
        vocab = model.config.vocab_size
        self.admission = Admission(self.kv, tokenizer, vocab, cfg.max_batch, slack)
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.requests: dict[str, RequestState] = {}
        self.metrics = EngineMetrics()
        self._serials = itertools.count()
        self.cost_feedback = CostFeedback.attach(self)

    @torch.inference_mode()
    def step(self) -> StepReport:
        """Admit and prefill what fits, then one speculative decode step for the running batch.

        The whole step runs in inference mode: no tensor of it is ever differentiated, and the
        policy's and the driver's many small tensor ops skip autograd's dispatch (on the AMD EPYC
        VM a two-depth :func:`~echo_scheduler.pool.grow_pool` went from 402 to 316 us)."""
        report = self._admit_and_prefill()
        batch = [s for s in self.running if s.phase is Phase.RUNNING]
        if batch:
            report = report.merge(self._decode_isolated(batch))
        self.metrics.add(report)
        return self.cost_feedback.observe(report)  # live verify cost: floor, K, report.cost

    # -- client side -------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> None:
        """Validate and queue a request; raises :class:`RequestError` with the reason."""
        if request.request_id in self.requests:
            raise RequestError(f"request id {request.request_id!r} is already in use")
        state = self.admission.new_state(request, next(self._serials))
        self.requests[request.request_id] = state
        self.waiting.append(state)

    def cancel(self, request_id: str) -> StepEvent | None:
        """Stop a request now and free its KV; None if it is unknown or already finished."""
        state = self.requests.get(request_id)
        if state is None or state.phase is Phase.FINISHED:
            return None
        if state in self.waiting:
            self.waiting.remove(state)
        self._finish(state, FinishReason.CANCELLED)
        return StepEvent(request_id, (), "", FinishReason.CANCELLED)

    def pop_finished(self, request_id: str) -> RequestState:
        """Remove a finished request's state from the engine and return it."""
        state = self.requests[request_id]
        if state.phase is not Phase.FINISHED:
            raise RequestError(f"request {request_id!r} has not finished")
        return self.requests.pop(request_id)

    def run(self) -> Iterator[StepEvent]:
        """Step until every submitted request has finished, yielding events as they come."""
        while self.has_work():
            yield from self.step().events

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def set_budget_override(self, k: int | None) -> None:
        """Cap K at a controller's lease ``k`` from the next step on (None: the local budget)."""
        self.budget.set_lease(k)

    def budget_k(self, batch_size: int) -> int:
        """K for a step over ``batch_size`` requests (the budget chain's local K and lease)."""
        return self.budget.k(batch_size)

    def set_gate(self, gate: GatePolicy) -> bool:
        """Draft under recalibrated gates from the next step on; False if the policy has none."""
        return self.policy.set_gate(gate)

    @property
    def elastic(self) -> ElasticFloor | None:
        """The budget chain's elastic floor (None: no floor)."""
        return self.budget.floor

    @elastic.setter
    def elastic(self, floor: ElasticFloor | None) -> None:
        self.budget.floor = floor

    # -- the step's parts, in order ------------------------------------------------------------

    def _admit_and_prefill(self) -> StepReport:
        """Before the decode phases: admit what fits, prefill this step's prompt chunks
        (chunking.py), and sample the first token of each request whose prompt is now cached."""
        timer = StepTimer()
        for state in self.admission.admit(self.waiting, len(self.running)):
            state.phase = Phase.PREFILLING
            self.running.append(state)
        prefilling = [s for s in self.running if s.phase is Phase.PREFILLING]
        if not prefilling:
            return StepReport([])
        left = [len(s.prompt_ids) - self.kv.cache_len(kv_handle(s)) for s in prefilling]
        grants = chunk_rows(left, self.config.prefill_chunk)
        chunk = [(s, g, n) for s, g, n in zip(prefilling, grants, left, strict=True) if g > 0]
        states = [s for s, _, _ in chunk]
        out = prefill(
            self.model, self.kv, states, self.drafter.aux_layers, [g for _, g, _ in chunk]
        )
        # The token after each chunk: the first output token where the prompt is done, else the
        # prompt's next token (the drafter's row t reads x_{t+1}).
        nxt = [
            first_token(s, out.logits[b]) if g == n else s.prompt_ids[-(n - g)]
            for b, (s, g, n) in enumerate(chunk)
        ]
        nxt_t = torch.tensor(nxt, dtype=torch.int64, device=self.device)
        self.drafter.observe(feedback([s.request_id for s in states], out, None, nxt_t))
        events = []
        for (state, g, n), token in zip(chunk, nxt, strict=True):
            if g == n:
                state.phase, state.first_token_s = Phase.RUNNING, time.perf_counter()
                events.append(self._emit(state, [token]))
        timer.mark("prefill")
        emitted = sum(len(e.token_ids) for e in events)
        return StepReport(events, len(events), emitted, phase_s=dict(timer.seconds))

    def _decode_isolated(self, batch: list[RequestState]) -> StepReport:
        """One decode step; if it fails before committing anything, find who made it fail.

        The speculative half (phases 1-4) changes no request state and returns its KV slots on
        failure, so it can be retried: each request then runs its own step, and only those whose
        own step fails finish with ``FinishReason.ERROR`` (the error text in their event). A
        failure while committing or emitting is re-raised: request state may be half updated
        there (the caller fails the batch).
        """
        try:
            return self._decode_step(batch)
        except SpeculationError as failed:
            if len(batch) == 1:
                return StepReport([self._fail(batch[0], failed.__cause__ or failed)])
            log.warning("step_failed_isolating", batch=len(batch), error=str(failed.__cause__))
        report = StepReport([])
        for state in batch:
            try:
                report = report.merge(self._decode_step([state]))
            except SpeculationError as failed:
                report = report.merge(StepReport([self._fail(state, failed.__cause__ or failed)]))
        return report

    def _decode_step(self, batch: list[RequestState]) -> StepReport:
        """Phases 1-4 (speculate.py), then 5-6 (:meth:`_commit_and_emit`)."""
        parts = (self.model, self.kv, self.drafter, self.policy, self.budget)
        spec = speculate(*parts, batch, self.config.max_depth, self.policy_device)
        return self._commit_and_emit(batch, spec)

    def _commit_and_emit(self, batch: list[RequestState], spec: Speculation) -> StepReport:
        """Commit (keep accepted KV, feed back) and emit (advance every request)."""
        timer, tree, out, result = spec.timer, spec.driven.tree, spec.out, spec.result
        accepted, n_acc = result.accepted_nodes, result.num_accepted
        commit_verified(self.kv, spec.handles, tree, out.slots, accepted, n_acc)
        ids = [s.request_id for s in batch]
        self.drafter.observe(
            feedback(ids, out, kept_rows(tree, accepted, n_acc), result.bonus_token)
        )
        draft_s, pdev = timer.seconds.get("draft"), self.policy_device  # drafter and policy
        self.policy.observe(StepOutcome(n_acc.to(pdev), tree.nodes_per_request().to(pdev), draft_s))
        timer.mark("commit")
        root_positions = torch.tensor(  # host bookkeeping for the step report
            [len(s.context) - 1 for s in batch], dtype=torch.int64, device="cpu"
        )
        counts = zip(n_acc.tolist(), tree.nodes_per_request().tolist(), strict=True)
        events = []
        for state, tokens, (a, n) in zip(batch, result.emitted_tokens(tree), counts, strict=True):
            state.steps, state.accepted, state.verified = (
                state.steps + 1,
                state.accepted + a,
                state.verified + n,
            )
            events.append(self._emit(state, tokens))
        timer.mark("emit")
        emitted = sum(len(e.token_ids) for e in events)
        phases, driven = dict(timer.seconds), spec.driven
        self.budget.observe(
            len(batch), tree.num_nodes, emitted, phases, driven.depths, driven.expansions
        )
        verified = VerifiedStep.of(
            batch, spec.step, driven, result, root_positions, out.forward_s, out.forward_events
        )
        return StepReport(events, 0, emitted, verified.stats.totals, phases, (verified,))

    def _emit(self, state: RequestState, tokens: Sequence[int]) -> StepEvent:
        """Phase 6 for one request: append ``tokens`` (emit.py), finish it if that ended it."""
        event = apply_new_tokens(state, tokens, self.tokenizer)
        if event.finish_reason is not None:
            self._finish(state, event.finish_reason)
        return event

    def _fail(self, state: RequestState, error: BaseException) -> StepEvent:
        """Finish ``state`` with ERROR because its own step failed."""
        log.error("request_step_failed", request_id=state.request_id, error=repr(error))
        self._finish(state, FinishReason.ERROR)
        return StepEvent(
            state.request_id, (), "", FinishReason.ERROR, f"decode step failed: {error!r}"
        )

    def _finish(self, state: RequestState, reason: FinishReason) -> None:
        state.phase, state.finish_reason = Phase.FINISHED, reason
        state.finished_s = time.perf_counter()
        self.admission.release(state)
        if state in self.running:
            self.running.remove(state)
        self.drafter.release(state.request_id)
        mal, tokens = round(state.mean_accepted_length, 3), len(state.output_ids)
        rid, why = state.request_id, reason.value
        log.debug("request_finished", request_id=rid, reason=why, tokens=tokens, mal=mal)
