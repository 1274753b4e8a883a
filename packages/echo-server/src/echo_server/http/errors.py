"""Errors of the HTTP API in OpenAI's JSON shape, and the gRPC status each one mirrors.

Body: ``{"error": {"message", "type", "param", "code"}}``. Status codes: 400 names the bad
field in ``param``; 401 a missing or wrong bearer token; 404 an unknown model or path; 405 a
wrong method; 413 a body over the size limit; 429 the queue is full (``Retry-After`` in
seconds); 503 the node is starting or draining; 504 the request's ``timeout_s`` passed; 500
the engine failed.
"""

from __future__ import annotations

import math

from starlette.responses import JSONResponse

from echo_controller.errors import FieldError
from echo_core.errors import EchoError
from echo_server.node.errors import DuplicateRequestError, QueueFullError, ShuttingDownError

# OpenAI's error ``type`` per HTTP status, and the gRPC status name that the refusal metric
# (echo_node_requests_refused_total{code}) counts it under, shared with the gRPC API.
_KINDS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "INVALID_ARGUMENT"),
    401: ("authentication_error", "UNAUTHENTICATED"),
    404: ("invalid_request_error", "NOT_FOUND"),
    405: ("invalid_request_error", "UNIMPLEMENTED"),
    409: ("invalid_request_error", "ALREADY_EXISTS"),
    413: ("invalid_request_error", "RESOURCE_EXHAUSTED"),
    429: ("rate_limit_error", "RESOURCE_EXHAUSTED"),
    500: ("server_error", "INTERNAL"),
    503: ("service_unavailable", "UNAVAILABLE"),
    504: ("timeout", "DEADLINE_EXCEEDED"),
}


class ApiError(Exception):
    """One refusal: its HTTP status, message, offending field and extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        if status not in _KINDS:
            raise ValueError(f"no error kind for HTTP status {status}")
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    @staticmethod
    def known(status: int) -> bool:
        return status in _KINDS

    @property
    def grpc_code(self) -> str:
        return _KINDS[self.status][1]

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": _KINDS[self.status][0],
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def from_engine(exc: Exception, prompt_param: str) -> ApiError:
    """The HTTP refusal for an error of the engine thread's admission or the engine itself."""
    if isinstance(exc, FieldError):
        return ApiError(400, f"{exc.field}: {exc.reason}", exc.field)
    if isinstance(exc, QueueFullError):
        seconds = max(1, math.ceil(exc.retry_after_ms / 1000))
        return ApiError(429, str(exc), code="queue_full", headers={"Retry-After": str(seconds)})
    if isinstance(exc, ShuttingDownError):
        return ApiError(503, str(exc), code="draining")
    if isinstance(exc, DuplicateRequestError):
        return ApiError(409, str(exc))
    if isinstance(exc, EchoError):  # engine.submit: the request can never fit this node
        return ApiError(400, str(exc), prompt_param, code="context_length_exceeded")
    return ApiError(500, f"the engine failed: {exc}")
