"""The generation API of a node (echo_proto.serving.v1): Generate, GenerateStream, GetStats.

Status codes (see serving.proto): INVALID_ARGUMENT naming the field; RESOURCE_EXHAUSTED when the
queue is full (trailing ``grpc-retry-pushback-ms``) or the prompt can never fit; ALREADY_EXISTS
for a request id in flight; UNAVAILABLE while draining; INTERNAL if the engine failed. A handler
that ends early (the client cancelled or disconnected, the deadline expired) cancels its request
in the engine, which frees its KV before the next step.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc
import structlog

from echo_controller.errors import FieldError
from echo_core.errors import EchoError
from echo_proto.serving.v1 import serving_pb2 as spb
from echo_proto.serving.v1 import serving_pb2_grpc
from echo_server.grpc import convert
from echo_server.node.engine_thread import EngineThread
from echo_server.node.errors import DuplicateRequestError, QueueFullError, ShuttingDownError
from echo_server.node.items import Delta, RequestStream
from echo_server.node.lease import ReceivedLease
from echo_server.node.limits import RequestLimits
from echo_server.node.metrics import NodeMetrics

log = structlog.get_logger(__name__)

RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"
SERVICE_NAME = spb.DESCRIPTOR.services_by_name["GenerationService"].full_name


class GenerationService(serving_pb2_grpc.GenerationServiceServicer):
    def __init__(
        self,
        worker: EngineThread,
        limits: RequestLimits,
        node_id: str,
        lease: Callable[[], ReceivedLease | None] = lambda: None,
        metrics: NodeMetrics | None = None,
    ) -> None:
        self._worker, self._limits, self.node_id = worker, limits, node_id  # set once bound
        self._lease, self._metrics = lease, metrics

    async def Generate(  # noqa: N802 (gRPC method name)
        self,
        request: spb.GenerateRequest,
        context: grpc.aio.ServicerContext[spb.GenerateRequest, spb.GenerateResponse],
    ) -> spb.GenerateResponse:
        stream = await self._start(request, context, "")
        try:
            async for item in stream:
                if not isinstance(item, Delta):
                    return convert.generate_response(item.summary)
        except (EchoError, RuntimeError) as exc:  # a rejection, or the engine failed
            await self._abort(context, exc)
        finally:
            if not stream.done:
                self._worker.cancel(stream.request_id)
        raise AssertionError("a request stream ends with a terminal item")

    async def GenerateStream(  # noqa: N802 (gRPC method name)
        self,
        request: spb.GenerateStreamRequest,
        context: grpc.aio.ServicerContext[spb.GenerateStreamRequest, spb.GenerateStreamResponse],
    ) -> AsyncIterator[spb.GenerateStreamResponse]:
        stream = await self._start(request.request, context, "request.")
        try:
            async for item in stream:
                if isinstance(item, Delta):
                    yield convert.stream_delta(item)
                else:
                    yield convert.stream_final(item.summary)
        except (EchoError, RuntimeError) as exc:  # a rejection, or the engine failed
            await self._abort(context, exc)
        finally:
            if not stream.done:
                self._worker.cancel(stream.request_id)

    async def GetStats(  # noqa: N802 (gRPC method name)
        self,
        request: spb.GetStatsRequest,
        context: grpc.aio.ServicerContext[spb.GetStatsRequest, spb.GetStatsResponse],
    ) -> spb.GetStatsResponse:
        worker = self._worker
        return convert.stats_response(
            self.node_id,
            worker.snapshot,
            worker.engine.policy.name,
            self._lease(),
            max_batch=worker.engine.config.max_batch,
            max_waiting=worker.capacity - worker.engine.config.max_batch,
        )

    async def _start(
        self, request: spb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any], prefix: str
    ) -> RequestStream:
        arrival = time.perf_counter()
        try:
            core = convert.generation_request(request, self._limits, uuid.uuid4().hex)
            return self._worker.submit(core, arrival)
        except FieldError as exc:
            await self._abort(context, FieldError(prefix + exc.field, exc.reason))
        except EchoError as exc:
            await self._abort(context, exc)

    async def _abort(self, context: grpc.aio.ServicerContext[Any, Any], exc: Exception) -> NoReturn:
        code, metadata = _status(exc)
        if self._metrics is not None:
            self._metrics.refused.labels(code.name).inc()
        if code is grpc.StatusCode.INTERNAL:
            log.error("request_failed", error=str(exc))
        await context.abort(code, str(exc), trailing_metadata=metadata)


def _status(exc: Exception) -> tuple[grpc.StatusCode, tuple[tuple[str, str], ...]]:
    if isinstance(exc, FieldError):
        return grpc.StatusCode.INVALID_ARGUMENT, ()
    if isinstance(exc, QueueFullError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, ((RETRY_PUSHBACK_KEY, str(exc.retry_after_ms)),)
    if isinstance(exc, DuplicateRequestError):
        return grpc.StatusCode.ALREADY_EXISTS, ()
    if isinstance(exc, ShuttingDownError):
        return grpc.StatusCode.UNAVAILABLE, ()
    if isinstance(exc, EchoError):  # engine.submit: the request can never fit this node
        return grpc.StatusCode.RESOURCE_EXHAUSTED, ()
    return grpc.StatusCode.INTERNAL, ()
