"""How long a verify pass's target forward took on the device, read without a sync of its own.

The quantity is the one the start-up profile times: ``model.forward`` + ``model.logits`` over
the pass's ``T = B + N`` rows.

- **CPU.** The forward runs synchronously: its wall time (``perf_counter`` around the two calls,
  ``PassOutput.forward_s``) is its cost.
- **CUDA.** The calls return once their kernels are queued, so their wall time is launch time.
  Two events recorded on the current stream before and after them (:func:`start_events`,
  :func:`stop_events`) bound the device work; ``start.elapsed_time(end)`` gives it in
  milliseconds once ``end.query()`` is True, which asks the driver and never waits. The engine
  already waits for the device once per step (commit reads the accepted counts on the host),
  after the forward, so a pass's events are normally complete when its step's report reaches
  the cost model. A pair that is not waits in :class:`PendingTimings` and is read in a later
  step. Events on one stream complete in the order recorded, so the queue is read oldest first
  and stops at the first incomplete pair.
- **Other devices:** no timing (no samples; the cost model keeps its start-up curve).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, cast

import structlog
import torch

log = structlog.get_logger(__name__)

MAX_PENDING = 64
"""Event pairs kept unread at most. The engine's per-step sync completes a pair within its own
step, so the queue holds one or two; a longer one means no pair completes (a stream other than
the current one ran the forward), and the oldest are dropped rather than kept forever."""


class TimingEvent(Protocol):
    """What :class:`torch.cuda.Event` offers for timing (``enable_timing=True``)."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float: ...


EventPair = tuple[TimingEvent, TimingEvent]


def start_events(device: torch.device) -> EventPair | None:
    """A start/end pair with the start recorded now on ``device``'s current stream; None off
    CUDA (the CPU times its forward by wall clock, other devices not at all)."""
    if device.type != "cuda":
        return None
    event = cast(Callable[..., TimingEvent], torch.cuda.Event)  # untyped in torch's stubs
    pair: EventPair = (event(enable_timing=True), event(enable_timing=True))
    pair[0].record()
    return pair


def stop_events(events: EventPair | None) -> EventPair | None:
    """Record ``events``' end on the current stream, after the forward's kernels."""
    if events is not None:
        events[1].record()
    return events


class PendingTimings:
    """Event pairs of verify passes not yet read, each with its row count (module docstring)."""

    def __init__(self, limit: int = MAX_PENDING) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self.queue: deque[tuple[int, EventPair]] = deque()
        self.dropped = 0

    def add(self, rows: int, events: EventPair) -> None:
        """Queue the pair of a pass over ``rows`` rows; drop the oldest past :attr:`limit`."""
        if len(self.queue) >= self.limit:
            self.queue.popleft()
            self.dropped += 1
            if self.dropped == 1:
                log.warning("verify_events_never_complete", limit=self.limit)
        self.queue.append((rows, events))

    def ready(self) -> list[tuple[int, float]]:
        """``(rows, seconds)`` of every pair the device has completed, oldest first; the rest
        stay queued. Never waits: ``query`` only asks."""
        out: list[tuple[int, float]] = []
        while self.queue and self.queue[0][1][1].query():
            rows, (start, end) = self.queue.popleft()
            out.append((rows, start.elapsed_time(end) / 1e3))
        return out
