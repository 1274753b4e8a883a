"""Before the decode phases: which waiting requests enter the running batch, their KV reservation.

Admission is by worst case: a request reserves ``prompt + max_tokens`` KV slots, and the pool
keeps ``verify_slack = K(1) + max_batch`` slots spare for the transient tree rows of a verify
pass (at most K draft rows plus one root per request), so a running request can never run out
of KV and nothing is ever preempted. A request is admitted, in arrival order, while

    running + admitted < max_batch   and   num_slots - reserved - need - verify_slack >= 0,

and one that could never fit an empty pool is refused at submit with the reason.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from echo_server.engine.request import GenerationRequest, RequestError, RequestState
from echo_server.kv.pool import KVPool
from echo_server.model.tokenizer import Tokenizer


def prompt_ids(request: GenerationRequest, tokenizer: Tokenizer, vocab_size: int) -> list[int]:
    """The prompt as token ids (chat template applied to text prompts when asked and present);
    raises :class:`RequestError` for ids outside ``[0, vocab_size)``."""
    if request.prompt_ids is not None:
        bad = [t for t in request.prompt_ids if not 0 <= t < vocab_size]
        if bad:
            raise RequestError(
                f"{request.request_id}: token ids out of [0, {vocab_size}): {bad[:5]}"
            )
        return list(request.prompt_ids)
    assert request.prompt is not None  # GenerationRequest guarantees exactly one
    if request.chat and tokenizer.has_chat_template:
        return tokenizer.apply_chat_template([{"role": "user", "content": request.prompt}])
    return tokenizer.encode(request.prompt)


class Admission:
    """Request validation and worst-case KV reservation over one :class:`KVPool` (module
    docstring)."""

    def __init__(
        self, kv: KVPool, tokenizer: Tokenizer, vocab_size: int, max_batch: int, verify_slack: int
    ) -> None:
        self.kv, self.tokenizer, self.vocab_size = kv, tokenizer, vocab_size
        self.max_batch, self.verify_slack = max_batch, verify_slack
        self.reserved = 0  # KV slots promised to running requests (worst case)

    def new_state(self, request: GenerationRequest, serial: int) -> RequestState:
        """The waiting state of a valid request; :class:`RequestError` says why one is not
        (bad token ids, or it could never fit the KV pool)."""
        ids = prompt_ids(request, self.tokenizer, self.vocab_size)
        self.refuse_never_fitting(request.request_id, len(ids), request.params.max_tokens)
        generator = torch.Generator(device="cpu")
        seed = request.params.seed
        generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,))))
        return RequestState(
            request=request,
            prompt_ids=ids,
            detokenizer=self.tokenizer.detokenizer(ids[-4:]),
            generator=generator,
            serial=serial,
            submitted_s=time.perf_counter(),
        )

    @staticmethod
    def need(state: RequestState) -> int:
        """Worst-case KV slots of ``state``: prompt plus every token it may generate."""
        return len(state.prompt_ids) + state.params.max_tokens

    def refuse_never_fitting(self, request_id: str, prompt_len: int, max_tokens: int) -> None:
        """Raise :class:`RequestError` if the request could not run even in an empty pool."""
        reason = self.kv.why_never_fits(prompt_len + max_tokens + self.verify_slack)
        if reason is not None:
            raise RequestError(f"{request_id}: {reason} (prompt {prompt_len} tokens)")

    def admit(self, waiting: deque[RequestState], running: int) -> list[RequestState]:
        """Pop the waiting requests that fit now (arrival order, no overtaking), give each a KV
        handle and reserve its worst case."""
        admitted: list[RequestState] = []
        while waiting and running + len(admitted) < self.max_batch:
            state = waiting[0]
            free_after = self.kv.num_slots - self.reserved - self.need(state) - self.verify_slack
            if free_after < 0:
                break  # waits until running requests finish
            waiting.popleft()
            state.kv = self.kv.add_request()
            self.reserved += self.need(state)
            admitted.append(state)
        return admitted

    def release(self, state: RequestState) -> None:
        """Free the KV of a finished request and its reservation (no-op if it held none)."""
        if state.kv is not None:
            self.kv.release_request(state.kv)
            self.reserved -= self.need(state)
            state.kv = None
