"""Transport security and limits for both servers: TLS, optional mTLS, bearer tokens, sizes.

- TLS: the server presents ``cert``/``key``; with ``client_ca`` it requires client certificates
  signed by that CA (mTLS). Clients trust ``ca`` and present their own ``cert``/``key`` for mTLS.
- Bearer token: :class:`BearerTokenInterceptor` refuses calls whose ``authorization`` metadata
  is not ``Bearer <token>`` with UNAUTHENTICATED (constant-time comparison), before the method is
  looked up: an unknown method without a token is UNAUTHENTICATED too, never UNIMPLEMENTED, so a
  caller without the token learns nothing about which methods exist, and its bytes are never
  parsed. The standard health service stays open so that probes need no secret (under mTLS
  they still need a client certificate: see ``--health-listen``). Tokens are read from a file,
  never from the command line (where ``ps`` would show them).
- Limits: both directions capped at ``max_message_bytes``; larger requests are refused with
  RESOURCE_EXHAUSTED and counted (:mod:`echo_controller.message_guard`).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

HEALTH_PREFIX = "/grpc.health.v1.Health/"
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class ServerTls:
    cert: Path
    key: Path
    client_ca: Path | None = None  # set: mTLS, client certificates required

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=self.client_ca.read_bytes() if self.client_ca else None,
            require_client_auth=self.client_ca is not None,
        )


@dataclass(frozen=True, slots=True)
class ClientTls:
    ca: Path
    cert: Path | None = None  # with key: the client certificate for mTLS
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("give both a client certificate and its key, or neither")

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.read_bytes(),
            private_key=self.key.read_bytes() if self.key else None,
            certificate_chain=self.cert.read_bytes() if self.cert else None,
        )


def read_token(path: Path | None) -> str | None:
    """The bearer token in ``path`` (surrounding whitespace stripped), None without a path."""
    if path is None:
        return None
    token = path.read_text(encoding="utf-8").strip()
    if not token or any(c.isspace() for c in token):
        raise ValueError(f"token file {path} must hold one non-empty token without spaces")
    return token


def auth_metadata(token: str | None) -> Metadata:
    """Call metadata that carries ``token`` (empty without one)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def message_options(
    max_message_bytes: int, receive_limit: int | None = None
) -> list[tuple[str, int]]:
    """Channel/server options: size limits, and no silent port sharing between servers.

    ``receive_limit`` (default ``max_message_bytes``) is the core's receive cap; a server sets
    it higher so that its message guard sees, refuses and counts oversized requests."""
    if max_message_bytes < 1024:
        raise ValueError(f"max_message_bytes must be >= 1024, got {max_message_bytes}")
    return [
        ("grpc.max_receive_message_length", receive_limit or max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]


def add_port(server: grpc.aio.Server, address: str, tls: ServerTls | None) -> int:
    """Bind ``address`` (``host:port``, port 0 = any free one); returns the bound port."""
    if tls is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, tls.credentials())
    if port == 0:
        raise OSError(f"could not bind {address}")
    return port


def open_channel(
    target: str, tls: ClientTls | None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> grpc.aio.Channel:
    # Reconnect within seconds of a restarted peer (gRPC's default backoff grows to 2 minutes).
    options = [
        *message_options(max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, tls.credentials(), options=options)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call without ``authorization: Bearer <token>`` (health checks excepted),
    known method or not; ``on_refused`` gets the status code name of each refusal."""

    def __init__(self, token: str, on_refused: Callable[[str], None] | None = None) -> None:
        self._expected = f"Bearer {token}".encode()
        self._on_refused = on_refused

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        if method.startswith(HEALTH_PREFIX) or self._authorized(handler_call_details):
            return await continuation(handler_call_details)
        if self._on_refused is not None:
            self._on_refused(grpc.StatusCode.UNAUTHENTICATED.name)
        # The handler's kind only, so that a streaming client sees the status; an unknown
        # method gets a unary refusal. The request bytes are never deserialized.
        handler = await continuation(handler_call_details)
        return _refusal(handler)

    def _authorized(self, details: grpc.HandlerCallDetails) -> bool:
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(given, self._expected)
        return False


async def _refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")


def _refusal(handler: grpc.RpcMethodHandler[Any, Any] | None) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same kind as ``handler`` (unary without one) that refuses the call."""
    if handler is None:
        return grpc.unary_unary_rpc_method_handler(_refuse)
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(_refuse)
