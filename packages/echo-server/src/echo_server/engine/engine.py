"""The engine loop: continuous batching with speculative steps under any echo-scheduler policy.

One call of :meth:`Engine.step` is one decode step of ARCHITECTURE.md's data path:

1. admit   waiting requests whose worst case fits the KV pool; prefill them (first token)
2. draft   the drafter expands depth by depth, the policy gating between depths
3. select  the policy picks <= K nodes over the whole batch -> SuperTree
4. verify  one target forward over every request's root + tree rows (tree attention)
5. accept  greedy, or lossless stochastic tree acceptance
6. commit  keep the KV of roots and accepted nodes, free the rest
7. emit    stream tokens; finish on EOS / max_tokens / stop strings

KV admission is by worst case: a request reserves ``prompt + max_tokens`` slots, and the pool
keeps ``K + B_max`` slots spare for the transient tree rows of a verify pass, so a running
request can never run out of KV (no preemption needed).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import structlog
import torch
from torch import Tensor

from echo_core.acceptance import AcceptResult
from echo_core.sampling import target_probs
from echo_core.tree import TreeBatch
from echo_scheduler.elastic import ElasticFloor
from echo_scheduler.interface import Policy, StepBatch, StepOutcome
from echo_server.drafting.base import Drafter
from echo_server.engine.budget import BudgetPolicy, load_or_measure, load_or_measure_profile
from echo_server.engine.drafting_loop import draft_and_select
from echo_server.engine.emit import apply_new_tokens
from echo_server.engine.metrics import EngineMetrics, StepTimer
from echo_server.engine.request import (
    FinishReason,
    GenerationRequest,
    Phase,
    RequestError,
    RequestState,
    StepEvent,
)
from echo_server.engine.verify import PassOutput, accept, feedback, prefill, verify_pass
from echo_server.kv.commit import commit_verified, kept_rows
from echo_server.kv.pool import KVPool, RequestHandle
from echo_server.model.llama import LlamaModel
from echo_server.model.tokenizer import Tokenizer

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine knobs. ``budget`` is K, draft tokens verified per step over the whole batch, or
    ``"auto"``: K_max from the verify-cost profile measured on this machine (engine/budget.py)."""

    budget: int | Literal["auto"] = 16
    max_batch: int = 8
    kv_slots: int = 16384
    max_context: int | None = None
    max_depth: int = 16  # safety bound on drafted depths per step
    elastic: bool = False  # per-step cost floor (echo_scheduler.elastic), from the verify profile

    def __post_init__(self) -> None:
        if self.budget != "auto" and (not isinstance(self.budget, int) or self.budget < 0):
            raise ValueError(f"budget must be an int >= 0 or 'auto', got {self.budget!r}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.kv_slots < 1:
            raise ValueError(f"kv_slots must be >= 1, got {self.kv_slots}")


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
        self.config = config or EngineConfig()
        self.kv = KVPool(
            model.config,
            self.config.kv_slots,
            max_requests=self.config.max_batch,
            max_context=self.config.max_context,
            dtype=model.dtype,
            device=model.device,
        )
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.requests: dict[str, RequestState] = {}
        self.metrics = EngineMetrics()
        self.budget = (
            BudgetPolicy(cost=load_or_measure(model))
            if self.config.budget == "auto"
            else BudgetPolicy(fixed=self.config.budget)
        )
        self.elastic = ElasticFloor(load_or_measure_profile(model)) if self.config.elastic else None
        self._reserved = 0  # KV slots promised to running requests (worst case)
        self._budget_override: int | None = None  # a controller lease (set_budget_override)

    # -- client side -------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> None:
        """Validate and queue a request; raises :class:`RequestError` with the reason."""
        if request.request_id in self.requests:
            raise RequestError(f"request id {request.request_id!r} is already in use")
        ids = self._prompt_ids(request)
        need = len(ids) + request.params.max_tokens
        reason = self.kv.why_never_fits(need + self._verify_slack())
        if reason is not None:
            raise RequestError(f"{request.request_id}: {reason} (prompt {len(ids)} tokens)")
        generator = torch.Generator(device="cpu")
        seed = request.params.seed
        generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,))))
        state = RequestState(
            request=request,
            prompt_ids=ids,
            detokenizer=self.tokenizer.detokenizer(ids[-4:]),
            generator=generator,
            submitted_s=time.perf_counter(),
        )
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

    def set_budget_override(self, k: int | None) -> None:
        """Cap K at ``k`` (a budget lease) from the next step on; None restores the local policy.

        The lease never lifts K above the local budget: the KV slack of admitted requests was
        sized for it, and past the local knee extra tokens cost more than they earn.
        """
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ValueError(f"budget override must be an int >= 0 or None, got {k!r}")
        self._budget_override = k

    def budget_k(self, batch_size: int) -> int:
        """K for a step over ``batch_size`` requests: the local budget, capped by a lease."""
        local = self.budget.budget(batch_size)
        return local if self._budget_override is None else min(local, self._budget_override)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def run(self) -> Iterator[StepEvent]:
        """Step until every submitted request has finished, yielding events as they come."""
        while self.has_work():
            yield from self.step()

    def pop_finished(self, request_id: str) -> RequestState:
        """Remove a finished request's state from the engine and return it."""
        state = self.requests[request_id]
        if state.phase is not Phase.FINISHED:
            raise RequestError(f"request {request_id!r} has not finished")
        return self.requests.pop(request_id)

    # -- the step ------------------------------------------------------------------------------

    def step(self) -> list[StepEvent]:
        """Admit and prefill what fits, then one speculative decode step for the running batch."""
        events = self._admit_and_prefill()
        batch = [s for s in self.running if s.phase is Phase.RUNNING]
        if batch:
            events += self._decode_isolated(batch)
        return events

    def _decode_isolated(self, batch: list[RequestState]) -> list[StepEvent]:
        """One decode step; if it fails before committing anything, find who made it fail.

        The speculative half of a step (draft, verify, accept) changes no request state and
        returns its KV slots on failure, so it can be retried: each request then runs its own
        step, and only those whose own step fails finish with ``FinishReason.ERROR`` (the error
        text in their event); the rest lose nothing. A failure while committing or emitting is
        re-raised: request state may be half-updated there (the caller fails the batch).
        """
        try:
            return self._decode_step(batch)
        except _SpeculationError as failed:
            if len(batch) == 1:
                return [self._fail(batch[0], failed.__cause__ or failed)]
            log.warning("step_failed_isolating", batch=len(batch), error=str(failed.__cause__))
        events: list[StepEvent] = []
        for state in batch:
            try:
                events += self._decode_step([state])
            except _SpeculationError as failed:
                events.append(self._fail(state, failed.__cause__ or failed))
        return events

    def _fail(self, state: RequestState, error: BaseException) -> StepEvent:
        """Finish ``state`` with ERROR because its own step failed."""
        log.error("request_step_failed", request_id=state.request_id, error=repr(error))
        self._finish(state, FinishReason.ERROR)
        return StepEvent(
            state.request_id, (), "", FinishReason.ERROR, f"decode step failed: {error!r}"
        )

    def _decode_step(self, batch: list[RequestState]) -> list[StepEvent]:
        """Draft, verify and accept (:meth:`_speculate`), then commit and emit."""
        return self._commit_and_emit(batch, self._speculate(batch))

    def _speculate(self, batch: list[RequestState]) -> _Speculation:
        """The step's first half; on any error its KV slots are returned and
        :class:`_SpeculationError` is raised, with no request state changed."""
        timer = StepTimer()
        slots: Tensor | None = None
        try:
            self.drafter.begin_step([s.context for s in batch], [s.request_id for s in batch])
            # A step emits accepted + 1 tokens: never draft past what max_tokens allows.
            caps = torch.tensor([max(s.remaining - 1, 0) for s in batch], dtype=torch.int64)
            greedy = torch.tensor([s.params.is_greedy for s in batch], dtype=torch.bool)
            floor = self.elastic.floor(len(batch)) if self.elastic is not None else None
            step = StepBatch(
                len(batch),
                self.budget_k(len(batch)),
                caps,
                greedy,
                min_utility=floor.min_utility if floor is not None else 0.0,
                depth_price=floor.depth_price if floor is not None else None,
            )
            drafted = draft_and_select(self.policy, self.drafter, step, self.config.max_depth)
            timer.mark("draft")

            handles = [s.kv for s in batch if s.kv is not None]
            roots = torch.tensor([s.root for s in batch], dtype=torch.int64)
            out = verify_pass(
                self.model, self.kv, handles, roots, drafted.tree, self.drafter.aux_layers
            )
            slots = out.slots
            timer.mark("verify")

            result = accept(drafted.tree, out.logits, batch)
            timer.mark("accept")
        except Exception as exc:
            if slots is not None:
                self.kv.free(slots)
            raise _SpeculationError(f"{type(exc).__name__}: {exc}") from exc
        return _Speculation(timer, drafted.tree, drafted.depths, handles, out, result)

    def _commit_and_emit(self, batch: list[RequestState], spec: _Speculation) -> list[StepEvent]:
        timer, tree, out, result = spec.timer, spec.tree, spec.out, spec.result
        commit_verified(
            self.kv, spec.handles, tree, out.slots, result.accepted_nodes, result.num_accepted
        )
        keep = kept_rows(tree, result.accepted_nodes, result.num_accepted)
        ids = [s.request_id for s in batch]
        self.drafter.observe(feedback(ids, out, keep, result.bonus_token))
        self.policy.observe(StepOutcome(result.num_accepted, tree.nodes_per_request()))
        timer.mark("commit")

        events = []
        emitted = result.emitted_tokens(tree)
        for b, state in enumerate(batch):
            n_acc = int(result.num_accepted[b])
            state.steps += 1
            state.accepted += n_acc
            state.verified += int(tree.nodes_per_request()[b])
            event = apply_new_tokens(state, emitted[b], self.tokenizer)
            if event.finish_reason is not None:
                self._finish(state, event.finish_reason)
            events.append(event)
        timer.mark("emit")
        emitted_total = sum(len(e.token_ids) for e in events)
        if self.elastic is not None:
            sec = timer.seconds
            self.elastic.observe(
                len(batch),
                verified=tree.num_nodes,
                emitted=emitted_total,
                verify_s=sec["verify"],
                other_s=sum(sec.values()) - sec["verify"],
                draft_s=sec["draft"],
                depths=spec.depths,
            )
        self.metrics.record_step(
            tree,
            result,
            timer,
            emitted=emitted_total,
            request_ids=ids,
            request_steps=[s.steps for s in batch],
        )
        return events

    # -- admission and prefill ----------------------------------------------------------------

    def _verify_slack(self) -> int:
        """Transient slots a verify pass may need beyond every request's worst case."""
        return self.budget.budget(1) + self.config.max_batch

    def _admit_and_prefill(self) -> list[StepEvent]:
        admitted: list[RequestState] = []
        while self.waiting and len(self.running) + len(admitted) < self.config.max_batch:
            state = self.waiting[0]
            need = len(state.prompt_ids) + state.params.max_tokens
            free_after = self.kv.num_slots - self._reserved - need - self._verify_slack()
            if free_after < 0:
                break  # waits until running requests finish
            self.waiting.popleft()
            state.kv = self.kv.add_request()
            self._reserved += need
            admitted.append(state)
        if not admitted:
            return []
        out = prefill(self.model, self.kv, admitted, self.drafter.aux_layers)
        first = [self._sample_first(s, out.logits[b]) for b, s in enumerate(admitted)]
        ids = [s.request_id for s in admitted]
        self.drafter.observe(feedback(ids, out, None, torch.tensor(first, dtype=torch.int64)))
        events = []
        for state, token in zip(admitted, first, strict=True):
            state.phase = Phase.RUNNING
            self.running.append(state)
            state.first_token_s = time.perf_counter()
            event = apply_new_tokens(state, [token], self.tokenizer)
            if event.finish_reason is not None:
                self._finish(state, event.finish_reason)
            events.append(event)
        return events

    def _sample_first(self, state: RequestState, logits: Tensor) -> int:
        """First output token from the prompt's last-row logits ([V] float32)."""
        p = state.params
        if p.is_greedy:
            return int(logits.argmax())
        probs = target_probs(
            logits.unsqueeze(0),
            torch.tensor([p.temperature]),
            torch.tensor([p.top_k]),
            torch.tensor([p.top_p]),
        )
        return int(torch.multinomial(probs[0], 1, generator=state.generator))

    def _finish(self, state: RequestState, reason: FinishReason) -> None:
        state.phase = Phase.FINISHED
        state.finish_reason = reason
        state.finished_s = time.perf_counter()
        if state.kv is not None:
            self.kv.release_request(state.kv)
            self._reserved -= len(state.prompt_ids) + state.params.max_tokens
            state.kv = None
        if state in self.running:
            self.running.remove(state)
        self.drafter.release(state.request_id)
        self.metrics.forget(state.request_id)
        log.debug(
            "request_finished",
            request_id=state.request_id,
            reason=reason.value,
            tokens=len(state.output_ids),
            mean_accepted_length=round(state.mean_accepted_length, 3),
        )

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        if request.prompt_ids is not None:
            vocab = self.model.config.vocab_size
            bad = [t for t in request.prompt_ids if not 0 <= t < vocab]
            if bad:
                raise RequestError(
                    f"{request.request_id}: token ids out of [0, {vocab}): {bad[:5]}"
                )
            return list(request.prompt_ids)
        assert request.prompt is not None
        if request.chat and self.tokenizer.has_chat_template:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": request.prompt}])
        return self.tokenizer.encode(request.prompt)


class _SpeculationError(RuntimeError):
    """A step failed before committing anything (its cause chained); safe to retry."""


@dataclass(frozen=True, slots=True)
class _Speculation:
    """What a step's first half hands to commit and emit."""

    timer: StepTimer
    tree: TreeBatch
    depths: int
    handles: list[RequestHandle]
    out: PassOutput
    result: AcceptResult
