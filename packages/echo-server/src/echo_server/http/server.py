"""The HTTP listener: uvicorn serving the app inside the node's own event loop.

The socket is bound here (port 0 picks a free one, :attr:`HttpServer.port` tells which), so
the ready file can name it. Signals stay with the node (``run_until_signalled``): uvicorn's own
handlers are not installed. TLS uses the same certificate and key as gRPC; with a client CA,
client certificates are required (mTLS).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import uvicorn

from echo_controller.security import ServerTls

STARTUP_TIMEOUT_S = 30.0
GRACEFUL_S = 5


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port); a clear error otherwise."""
    host, sep, port = listen.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {listen!r}")
    return host, int(port)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the node owns SIGINT / SIGTERM
        yield


class HttpServer:
    """A started uvicorn server; :meth:`stop` ends it."""

    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None], port: int) -> None:
        self._server, self._task, self.port = server, task, port

    @classmethod
    async def start(cls, app: Any, listen: str, tls: ServerTls | None = None) -> HttpServer:
        host, port = parse_listen(listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        tls_options: dict[str, Any] = {}
        if tls is not None:
            tls_options = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
            if tls.client_ca is not None:
                tls_options |= {
                    "ssl_ca_certs": str(tls.client_ca),
                    "ssl_cert_reqs": ssl.CERT_REQUIRED,
                }
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_S,
            **tls_options,
        )
        server = _Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        deadline = asyncio.get_running_loop().time() + STARTUP_TIMEOUT_S
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
                raise RuntimeError("the HTTP server stopped during start-up")
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the HTTP server did not start within {STARTUP_TIMEOUT_S} s")
            await asyncio.sleep(0.01)
        return cls(server, task, sock.getsockname()[1])

    async def stop(self) -> None:
        self._server.should_exit = True
        await self._task
