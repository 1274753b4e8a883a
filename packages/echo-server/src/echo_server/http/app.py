"""The OpenAI-compatible routes of a node, on the engine thread the gRPC API uses.

``POST /v1/completions`` and ``POST /v1/chat/completions`` (``stream: true`` answers with
server-sent events, ``data: <json>`` per chunk and ``data: [DONE]`` last), ``GET /v1/models``,
``GET /health`` (200 serving, 503 starting or draining) and ``GET /metrics`` (Prometheus,
the node's registry). A request ends early when the client disconnects or its ``timeout_s``
passes: it is cancelled in the engine, which frees its KV before the next step.

A stream answers errors found before the first token with a status code like a unary call
(the engine's admission runs first); after that, an error is one ``data: {"error": ...}``
event before ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from openai.types import Model
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse

from echo_core.errors import EchoError
from echo_server.engine import GenerationRequest
from echo_server.http import translate
from echo_server.http.errors import ApiError, from_engine
from echo_server.http.guard import Guard
from echo_server.http.schemas import ChatCompletionBody, CompletionBody
from echo_server.node.engine_thread import EngineThread
from echo_server.node.items import Delta, Finished, RequestStream, RequestSummary
from echo_server.node.limits import RequestLimits
from echo_server.node.metrics import NodeMetrics

log = structlog.get_logger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass
class HttpState:
    """What the routes share; ``serving`` is False while starting and once draining."""

    worker: EngineThread
    limits: RequestLimits
    model_name: str
    metrics: NodeMetrics | None = None
    token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    serving: bool = False
    created: int = field(default_factory=translate.now)

    def refused(self, grpc_code: str) -> None:
        if self.metrics is not None:
            self.metrics.refused.labels(grpc_code).inc()


def create_app(state: HttpState) -> Guard:
    """The ASGI app: the routes behind :class:`~echo_server.http.guard.Guard`."""
    app = FastAPI(title="ECHO", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> Response:
        state.refused(exc.grpc_code)
        if exc.status >= 500:
            log.warning("http_request_failed", status=exc.status, error=exc.message)
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def bad_body(_request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [p for p in first.get("loc", ()) if p != "body"]
        param = loc[0] if loc and isinstance(loc[0], str) else None  # the top-level field
        where = ".".join(str(p) for p in loc) if param else "body"
        message = f"{where}: {first.get('msg', 'invalid request body')}"
        return await api_error(_request, ApiError(400, message, param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> Response:
        kind = exc.status_code if ApiError.known(exc.status_code) else 400
        return await api_error(_request, ApiError(kind, f"{exc.detail}", code=str(exc.status_code)))

    @app.get("/health")
    async def health() -> Response:
        if state.serving:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=503)

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        return {"object": "list", "data": [_model(state).model_dump(exclude_none=True)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, object]:
        if model_id != state.model_name:
            raise ApiError(404, f"model {model_id!r} not found", "model", "model_not_found")
        return _model(state).model_dump(exclude_none=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request) -> Response:
        _check_model(state, body.model)
        rid = uuid.uuid4().hex
        core = translate.completion_request(body, state.limits, rid)
        return await _generate(state, request, core, body, "prompt", chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionBody, request: Request) -> Response:
        _check_model(state, body.model)
        rid = uuid.uuid4().hex
        core = translate.chat_request(body, state.limits, state.worker.engine.tokenizer, rid)
        return await _generate(state, request, core, body, "messages", chat=True)

    @app.get("/metrics")
    async def metrics() -> Response:
        if state.metrics is None:
            raise ApiError(404, "this node keeps no metrics")
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Guard(app, state.token, state.max_body_bytes, state.refused)


def _model(state: HttpState) -> Model:
    return Model(id=state.model_name, created=state.created, object="model", owned_by="echo")


def _check_model(state: HttpState, name: str | None) -> None:
    if name is not None and name != state.model_name:
        raise ApiError(
            404,
            f"model {name!r} not found; this node serves {state.model_name!r}",
            "model",
            "model_not_found",
        )


# -- one request ---------------------------------------------------------------------------------


class _EndedEarlyError(Exception):
    """The client disconnected or the deadline passed; the request was cancelled."""

    def __init__(self, error: ApiError | None) -> None:
        super().__init__("request ended early")
        self.error = error  # None: the client is gone, nobody to tell

    def response(self) -> Response:
        """The deadline's error, or 499 (client closed request) when nobody is listening."""
        return self.error.response() if self.error else Response(status_code=499)


class _Flow:
    """One request's items, each awaited against the client's disconnect and the deadline."""

    def __init__(
        self, state: HttpState, request: Request, stream: RequestStream, timeout_s: float | None
    ) -> None:
        self.state, self.stream = state, stream
        loop = asyncio.get_running_loop()
        self.deadline = loop.time() + timeout_s if timeout_s is not None else None
        self.timeout_s = timeout_s
        self._gone = asyncio.create_task(_disconnected(request))

    async def next(self) -> Delta | Finished:
        item = asyncio.ensure_future(self.stream.__anext__())
        remaining = None
        if self.deadline is not None:
            remaining = max(self.deadline - asyncio.get_running_loop().time(), 0.0)
        done, _ = await asyncio.wait(
            {item, self._gone}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
        )
        if item in done:
            return item.result()  # raises a rejection or the engine's failure
        item.cancel()
        self.close()
        if self._gone in done:
            raise _EndedEarlyError(None)
        raise _EndedEarlyError(
            ApiError(
                504,
                f"timeout_s = {self.timeout_s} passed; request cancelled",
                "timeout_s",
                "timeout",
            )
        )

    def close(self) -> None:
        """Cancel the request in the engine unless it has finished; stop watching."""
        self._gone.cancel()
        if not self.stream.done:
            self.state.worker.cancel(self.stream.request_id)
            self.stream.done = True


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _generate(
    state: HttpState,
    request: Request,
    core: GenerationRequest,
    body: CompletionBody | ChatCompletionBody,
    prompt_param: str,
    *,
    chat: bool,
) -> Response:
    if not state.serving:
        raise ApiError(503, "the node is not serving (starting or draining)", code="unavailable")
    try:
        stream = state.worker.submit(core, time.perf_counter())
    except EchoError as exc:
        raise from_engine(exc, prompt_param) from exc
    flow = _Flow(state, request, stream, body.timeout_s)
    try:
        first = await flow.next()
    except _EndedEarlyError as ended:
        return ended.response()
    except (EchoError, RuntimeError) as exc:
        flow.close()
        raise from_engine(exc, prompt_param) from exc
    created = translate.now()
    if not body.stream:
        return await _unary(flow, first, state.model_name, created, chat, prompt_param)
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    events = _events(flow, first, state.model_name, created, chat, include_usage)
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def _unary(
    flow: _Flow, item: Delta | Finished, model: str, created: int, chat: bool, prompt_param: str
) -> Response:
    try:
        while not isinstance(item, Finished):
            item = await flow.next()
    except _EndedEarlyError as ended:
        return ended.response()
    except (EchoError, RuntimeError) as exc:
        raise from_engine(exc, prompt_param) from exc
    finally:
        flow.close()
    summary = item.summary
    reply: BaseModel = (translate.chat_completion if chat else translate.completion)(
        summary, model, created
    )
    return Response(reply.model_dump_json(), media_type="application/json")


async def _events(
    flow: _Flow, item: Delta | Finished, model: str, created: int, chat: bool, include_usage: bool
) -> AsyncIterator[str]:
    rid = flow.stream.request_id
    piece: Callable[[str, str | None], BaseModel]
    if chat:
        yield _sse(
            translate.chat_chunk(rid, model, created, ChoiceDelta(role="assistant", content=""))
        )
        piece = lambda text, finish: translate.chat_chunk(  # noqa: E731
            rid, model, created, ChoiceDelta(content=text) if text else ChoiceDelta(), finish
        )
    else:
        piece = lambda text, finish: translate.completion_chunk(  # noqa: E731
            rid, model, created, text, finish
        )
    try:
        while isinstance(item, Delta):
            if item.text:
                yield _sse(piece(item.text, None))
            item = await flow.next()
        summary: RequestSummary = item.summary
        final = piece("", translate.finish_reason(summary))
        translate.with_stats(final, summary)
        yield _sse(final)
        if include_usage:
            yield _sse_json(_usage_chunk(rid, model, created, chat, summary))
    except _EndedEarlyError as ended:
        if ended.error is None:
            return
        yield _sse_json(ended.error.body())
    except ApiError as exc:  # the request was cancelled or failed in the engine
        yield _sse_json(exc.body())
    except (EchoError, RuntimeError) as exc:
        yield _sse_json(from_engine(exc, "prompt").body())
    finally:
        flow.close()
    yield "data: [DONE]\n\n"


def _usage_chunk(
    rid: str, model: str, created: int, chat: bool, summary: RequestSummary
) -> dict[str, object]:
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{rid}",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": translate.usage(summary).model_dump(),
    }


def _sse(chunk: BaseModel) -> str:
    return f"data: {chunk.model_dump_json(exclude_unset=True, warnings=False)}\n\n"


def _sse_json(payload: dict[str, object]) -> str:
    return f"data: {json.dumps(payload)}\n\n"
