"""What the engine thread sends back for one request: deltas, then one terminal item."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from echo_server.engine import FinishReason
from echo_server.engine.request import RequestState


@dataclass(frozen=True, slots=True)
class Delta:
    """Tokens one step committed for the request, and the text they complete."""

    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True, slots=True)
class RequestSummary:
    """A finished request: its output and what speculation did for it (times in ms)."""

    request_id: str
    finish_reason: FinishReason
    prompt_tokens: int
    token_ids: tuple[int, ...]
    text: str
    steps: int
    verified: int
    accepted: int
    mean_accepted_length: float
    draft_yield: float
    queue_ms: float
    ttft_ms: float
    total_ms: float


@dataclass(frozen=True, slots=True)
class Finished:
    summary: RequestSummary


@dataclass(frozen=True, slots=True)
class Rejected:
    error: Exception  # EchoError from engine.submit, or the engine's own failure


Item = Delta | Finished | Rejected


class RequestStream:
    """The items of one request, as an async iterator; a rejection is raised."""

    def __init__(self, request_id: str, items: asyncio.Queue[Item]) -> None:
        self.request_id = request_id
        self.done = False
        self._items = items

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Delta | Finished:
        if self.done:
            raise StopAsyncIteration
        item = await self._items.get()
        if isinstance(item, Rejected):
            self.done = True
            raise item.error
        self.done = isinstance(item, Finished)
        return item


def summarize(state: RequestState, arrival: float, queue_ms: float | None) -> RequestSummary:
    """The summary of a finished request; ``arrival`` and the state's times are perf_counter."""
    if state.finish_reason is None:
        raise ValueError(f"request {state.request_id!r} has not finished")
    end = state.finished_s if state.finished_s is not None else time.perf_counter()
    total_ms = (end - arrival) * 1000
    first = state.first_token_s
    return RequestSummary(
        request_id=state.request_id,
        finish_reason=state.finish_reason,
        prompt_tokens=len(state.prompt_ids),
        token_ids=tuple(state.output_ids),
        text=state.text,
        steps=state.steps,
        verified=state.verified,
        accepted=state.accepted,
        mean_accepted_length=state.mean_accepted_length,
        draft_yield=state.draft_yield,
        queue_ms=queue_ms if queue_ms is not None else total_ms,
        ttft_ms=(first - arrival) * 1000 if first is not None else total_ms,
        total_ms=total_ms,
    )
