"""ASGI middleware in front of every route: bearer-token check, then a body size limit.

Authentication runs before routing, so without the token every path but the open ones
(``/health``, for load-balancer probes: a documented, explicit choice) answers 401, unknown
paths included: an unauthenticated caller learns nothing about which routes exist. The body is
read (at most ``max_body_bytes``) before the app sees it; a larger one answers 413.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from echo_server.http.errors import ApiError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health"})


class Guard:
    """Wraps ``app`` (module docstring); ``on_refused(grpc_code)`` counts each refusal."""

    def __init__(
        self,
        app: App,
        token: str | None,
        max_body_bytes: int,
        on_refused: Callable[[str], None] = lambda _code: None,
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.app, self.max_body_bytes, self.on_refused = app, max_body_bytes, on_refused
        self._expected = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._expected is not None and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                error = ApiError(
                    401,
                    "missing or wrong bearer token",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await self._refuse(error, send)
                return
        body = await self._read_body(receive)
        if body is None:
            limit = self.max_body_bytes
            await self._refuse(ApiError(413, f"request body over {limit} bytes"), send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None once it exceeds the limit."""
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away; the app sees an empty body and the disconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(parts)

    async def _refuse(self, error: ApiError, send: Send) -> None:
        self.on_refused(error.grpc_code)
        payload = json.dumps(error.body()).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(payload)),
        ]
        headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands out the buffered body once, then the client's own messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
