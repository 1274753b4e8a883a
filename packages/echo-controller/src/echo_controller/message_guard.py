"""Refusing malformed and oversized request messages with a status code, not a traceback.

gRPC's own handling of a request it cannot parse is to log a traceback and answer UNKNOWN with
the parser's exception text; an oversized one is refused inside the core, where no counter sees
it. :class:`MessageGuardInterceptor` wraps every unary-request handler so that:

- bytes that do not parse (corrupt wire data, invalid UTF-8 in a ``string`` field) answer
  INVALID_ARGUMENT ``malformed request message``;
- a message above ``max_message_bytes`` answers RESOURCE_EXHAUSTED naming both sizes (the core
  limit is set to :data:`CORE_LIMIT_FACTOR` times the limit, see :func:`server_receive_limit`, so
  that such messages reach this check; larger ones the core still refuses, uncounted);
- each refusal calls ``on_refused(code name)`` (the process's refusal metric) and logs through a
  :class:`RateLimitedLog`: at most one line per code per interval, with the number suppressed.

Streaming-request handlers (reflection) pass through unchanged.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import structlog
from google.protobuf.message import DecodeError

log = structlog.get_logger(__name__)

CORE_LIMIT_FACTOR = 2
LOG_INTERVAL_S = 10.0


def server_receive_limit(max_message_bytes: int) -> int:
    """The core's receive limit: ``CORE_LIMIT_FACTOR * max_message_bytes`` (see the module)."""
    return CORE_LIMIT_FACTOR * max_message_bytes


@dataclass(frozen=True, slots=True)
class RefusedMessage:
    """What the guarded deserializer returns instead of a request it refuses."""

    code: grpc.StatusCode
    details: str


class RateLimitedLog:
    """One warning per ``key`` per ``interval_s``; the lines in between are counted, not logged.

    Invariant: over any window of ``interval_s`` seconds at most one line per key is written, and
    each written line's ``suppressed`` is the number of events since the previous line."""

    def __init__(
        self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval_s, self._clock = interval_s, clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, event: str, **fields: Any) -> bool:
        """Log ``event`` unless ``key`` was logged within the interval; True if written."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        log.warning(event, suppressed=self._suppressed.pop(key, 0), **fields)
        return True


if TYPE_CHECKING:  # the stubs' generic is not subscriptable at run time
    Handler = grpc.RpcMethodHandler[Any, Any]


class MessageGuardInterceptor(grpc.aio.ServerInterceptor):
    """Refuses unparseable and oversized unary requests (module docstring)."""

    def __init__(
        self,
        max_message_bytes: int,
        on_refused: Callable[[str], None] | None = None,
        refusal_log: RateLimitedLog | None = None,
    ) -> None:
        self._max = max_message_bytes
        self._on_refused = on_refused
        self._log = refusal_log or RateLimitedLog()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        parse = handler.request_deserializer

        def deserialize(data: bytes) -> Any:
            if len(data) > self._max:
                return RefusedMessage(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"request message of {len(data)} bytes exceeds the limit of {self._max}",
                )
            try:
                return parse(data)
            except (DecodeError, UnicodeDecodeError, ValueError):
                return RefusedMessage(grpc.StatusCode.INVALID_ARGUMENT, "malformed request message")

        if handler.response_streaming:
            assert handler.unary_stream is not None
            return grpc.unary_stream_rpc_method_handler(
                self._guard_stream(handler.unary_stream, method),
                request_deserializer=deserialize,
                response_serializer=handler.response_serializer,
            )
        assert handler.unary_unary is not None
        return grpc.unary_unary_rpc_method_handler(
            self._guard_unary(handler.unary_unary, method),
            request_deserializer=deserialize,
            response_serializer=handler.response_serializer,
        )

    async def _refuse(
        self, refused: RefusedMessage, method: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        if self._on_refused is not None:
            self._on_refused(refused.code.name)
        self._log.warning(
            refused.code.name, "request_refused", code=refused.code.name, method=method
        )
        await context.abort(refused.code, refused.details)

    def _guard_unary(self, behavior: Any, method: str) -> Any:
        async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if isinstance(request, RefusedMessage):
                await self._refuse(request, method, context)
            result = behavior(request, context)
            return await result if inspect.isawaitable(result) else result

        return guarded

    def _guard_stream(self, behavior: Any, method: str) -> Any:
        async def guarded(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            if isinstance(request, RefusedMessage):
                await self._refuse(request, method, context)
            result = behavior(request, context)
            if inspect.isawaitable(result):
                result = await result
            if hasattr(result, "__aiter__"):
                async for item in result:
                    yield item
            elif result is not None:
                for item in result:
                    yield item

        return guarded
