"""The one thread that owns the engine, and the asyncio-side handles every transport uses.

The engine is synchronous and not thread-safe: only the engine thread touches it. Handlers on
the event loop send it commands (closures, run in FIFO order between steps); it sends each
request's items back to the loop (``call_soon_threadsafe``): :class:`Delta` per step that
committed tokens, then exactly one terminal item, :class:`Finished` (with the request's stats)
or :class:`Rejected` (``engine.submit`` refused it). Because commands are FIFO, a cancel sent
after a submit always finds the request admitted, finished or rejected: every request ends with
one terminal item, and a cancelled request frees its KV before the next step.

Bookkeeping of in-flight requests lives on the loop thread only, so admission control (queue
full, draining, duplicate ids) answers at once without waiting for a step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import structlog

from echo_core.errors import EchoError
from echo_gating.policy import GatePolicy
from echo_server.engine import Engine, FinishReason, GenerationRequest, StepEvent, StepReport
from echo_server.node.errors import DuplicateRequestError, QueueFullError, ShuttingDownError
from echo_server.node.items import (
    Delta,
    Finished,
    Item,
    Rejected,
    RequestStream,
    RequestSummary,
    summarize,
)
from echo_server.node.stats import NodeSnapshot, StatsWindow, StepSample

log = structlog.get_logger(__name__)

T = TypeVar("T")
RETRY_MIN_MS, RETRY_MAX_MS, RETRY_DEFAULT_MS = 100, 60_000, 1_000


@dataclass(slots=True)
class _Flight:
    items: asyncio.Queue[Item]
    arrival: float
    queue_ms: float | None = None  # set on the engine thread at the first event


class EngineThread:
    """Runs ``engine`` in a dedicated thread (module docstring)."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_waiting: int,
        window_s: float = 10.0,
        on_step: Callable[[StepSample], None] | None = None,
        on_finish: Callable[[RequestSummary], None] | None = None,
        consumers: Sequence[Callable[[StepReport], None]] = (),
    ) -> None:
        """``consumers`` see every step's report on the engine thread, before its events are
        dispatched (the node's drift observer is one: :meth:`GateObserver.consume
        <echo_server.node.drift.GateObserver.consume>`); ``on_step`` and ``on_finish`` see the
        step's sample and each finished request's summary, after."""
        if max_waiting < 0 or window_s <= 0:
            raise ValueError(f"need max_waiting >= 0, window_s > 0: {max_waiting}, {window_s}")
        self.engine = engine
        self.capacity = engine.config.max_batch + max_waiting
        self.window_s = window_s
        self._on_step, self._on_finish = on_step, on_finish
        self._consumers = tuple(consumers)
        self._commands: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="echo-engine", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        # engine thread only:
        self._timing: dict[str, _Flight] = {}
        self._stats = StatsWindow(window_s)
        # loop thread only:
        self._flights: dict[str, _Flight] = {}
        self._durations: deque[float] = deque(maxlen=32)
        self._draining = False
        self._idle = asyncio.Event()
        self.snapshot = NodeSnapshot(window_s=window_s)

    # -- loop side ---------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._idle.set()
        self._thread.start()
        self._send(self._refresh)

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    def submit(self, request: GenerationRequest, arrival: float) -> RequestStream:
        """Queue a request; refusals that need no engine raise here, the rest arrive as items."""
        rid = request.request_id
        if self._draining:
            raise ShuttingDownError("the node is shutting down and admits no new requests")
        if rid in self._flights:
            raise DuplicateRequestError(f"request_id: {rid!r} is already in flight")
        if len(self._flights) >= self.capacity:
            retry = self.retry_after_ms()
            raise QueueFullError(
                f"queue full: {len(self._flights)} requests in flight (capacity "
                f"{self.capacity}); retry after {retry} ms",
                retry,
            )
        flight = _Flight(asyncio.Queue(), arrival)
        self._flights[rid] = flight
        self._idle.clear()
        self._send(lambda: self._admit(request, flight))
        return RequestStream(rid, flight.items)

    def cancel(self, request_id: str) -> None:
        """Abort a request before the next step (no-op once it has finished)."""
        self._send(lambda: self._cancel(request_id))

    def retry_after_ms(self) -> int:
        """Time until a slot frees, about: mean request time x queue depth / batch size."""
        if not self._durations:
            return RETRY_DEFAULT_MS
        mean_ms = sum(self._durations) / len(self._durations)
        over = len(self._flights) - self.engine.config.max_batch + 1
        ms = mean_ms * max(over, 1) / self.engine.config.max_batch
        return int(min(max(ms, RETRY_MIN_MS), RETRY_MAX_MS))

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine thread between steps and return its result."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)

        self._send(run)
        return await asyncio.wrap_future(future)

    async def set_budget_override(self, k: int | None) -> None:
        await self.call(lambda: self._set_budget(k))

    async def set_gate(self, gate: GatePolicy) -> bool:
        """Swap the ECHO policy's gates between steps; False if the policy has none."""
        return await self.call(lambda: self._set_gate(gate))

    async def drain(self, grace_s: float) -> int:
        """Admit nothing more; let in-flight requests finish within ``grace_s``, then cancel the
        rest. Returns how many were cancelled."""
        self._draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=grace_s)
            return 0
        except asyncio.TimeoutError:
            left = list(self._flights)
            for rid in left:
                self.cancel(rid)
            await self._idle.wait()
            return len(left)

    async def close(self) -> None:
        self._commands.put(None)
        await asyncio.to_thread(self._thread.join)

    def _send(self, command: Callable[[], None]) -> None:
        self._commands.put(command)

    def _deliver(self, request_id: str, item: Item) -> None:
        flight = self._flights.get(request_id)
        if flight is None:
            return
        flight.items.put_nowait(item)
        if isinstance(item, Delta):
            return
        del self._flights[request_id]
        if isinstance(item, Finished):
            self._durations.append(item.summary.total_ms)
        if not self._flights:
            self._idle.set()

    # -- engine thread -----------------------------------------------------------------------

    def _main(self) -> None:
        while self._run_commands():
            if self.engine.has_work():
                self._step()

    def _run_commands(self) -> bool:
        """Run the queued commands, waiting for one while the engine is idle; False on close."""
        block = not self.engine.has_work()
        while True:
            try:
                command = self._commands.get(block=block)
            except queue.Empty:
                return True
            if command is None:
                return False
            try:
                command()
            except Exception:  # commands report their own errors; this is a bug guard
                log.exception("engine_command_failed")
            block = False

    def _post(self, request_id: str, item: Item) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._deliver, request_id, item)

    def _admit(self, request: GenerationRequest, flight: _Flight) -> None:
        try:
            self.engine.submit(request)
        except EchoError as exc:
            self._post(request.request_id, Rejected(exc))
            return
        except Exception as exc:  # e.g. the tokenizer failing on odd input: this request only
            log.exception("engine_submit_failed", request_id=request.request_id)
            self._post(request.request_id, Rejected(RuntimeError(f"submit failed: {exc}")))
            return
        self._timing[request.request_id] = flight
        self._refresh()

    def _cancel(self, request_id: str) -> None:
        event = self.engine.cancel(request_id)
        if event is not None:
            self._finish(request_id)
            self._refresh()

    def _step(self) -> None:
        """One engine step; its report feeds the stats window, the report consumers (the node's
        drift observer) and the metrics."""
        start = time.perf_counter()
        try:
            report = self.engine.step()
        except Exception as exc:  # an engine bug must not take the node down: fail the batch
            log.exception("engine_step_failed")
            self._fail_all(exc)
            return
        now = time.perf_counter()
        sample = StepSample.of(report, now - start)
        self._stats.add(sample, now)
        for consume in self._consumers:
            consume(report)
        for event in report.events:
            self._dispatch(event, start)
        self._refresh()
        if self._on_step is not None:
            self._on_step(sample)

    def _dispatch(self, event: StepEvent, step_start: float) -> None:
        flight = self._timing.get(event.request_id)
        if flight is not None and flight.queue_ms is None:
            flight.queue_ms = (step_start - flight.arrival) * 1000
        if event.token_ids or event.text:
            self._post(event.request_id, Delta(event.token_ids, event.text))
        if event.finish_reason is FinishReason.ERROR:  # its own step failed, others went on
            self.engine.pop_finished(event.request_id)
            self._timing.pop(event.request_id, None)
            self._post(event.request_id, Rejected(RuntimeError(event.error or "step failed")))
        elif event.finish_reason is not None:
            self._finish(event.request_id)

    def _finish(self, request_id: str) -> None:
        state = self.engine.pop_finished(request_id)
        flight = self._timing.pop(request_id, None)
        arrival = flight.arrival if flight is not None else state.submitted_s
        summary = summarize(state, arrival, flight.queue_ms if flight is not None else None)
        self._post(request_id, Finished(summary))
        if self._on_finish is not None:
            self._on_finish(summary)

    def _fail_all(self, exc: Exception) -> None:
        for rid in list(self.engine.requests):
            try:
                self.engine.cancel(rid)
                self.engine.pop_finished(rid)
            except Exception:
                log.exception("engine_cancel_failed", request_id=rid)
                self.engine.requests.pop(rid, None)
            self._timing.pop(rid, None)
            self._post(rid, Rejected(RuntimeError(f"engine step failed: {exc}")))
        self._refresh()

    def _set_budget(self, k: int | None) -> None:
        self.engine.set_budget_override(k)
        self._refresh()

    def _set_gate(self, gate: GatePolicy) -> bool:
        swapped = self.engine.set_gate(gate)
        self._refresh()
        return swapped

    def _refresh(self) -> None:
        gate = self.engine.policy.active_gate()
        running = len(self.engine.running)
        self.snapshot = self._stats.snapshot(
            time.perf_counter(),
            running=running,
            waiting=len(self.engine.waiting),
            budget_k=self.engine.budget_k(max(running, 1)),
            gate_version=gate.version if gate is not None else "none",
        )
