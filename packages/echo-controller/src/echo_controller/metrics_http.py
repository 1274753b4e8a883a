"""The ``/metrics`` endpoint of both processes: Prometheus text over HTTP(S), optionally guarded.

Binding: ``--metrics-listen host:port``; a bare ``:port`` or ``port`` binds 127.0.0.1, so the
endpoint is local unless an address is named. Guard (``--metrics-auth``):

- ``server``: the gRPC server's own guard: its TLS certificate (HTTPS), its client CA (client
  certificates required: mTLS) and its bearer token (``Authorization: Bearer <token>``, else
  401). With neither TLS nor token on the gRPC server there is nothing to require.
- ``none``: plain HTTP, no token.
- ``auto`` (default): ``server`` unless the endpoint binds a loopback address.

The metrics show topology and load, no prompts nor tokens; ``auto`` keeps them as private as the
gRPC port whenever they leave the host.
"""

from __future__ import annotations

import hmac
import ipaddress
import ssl
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from echo_controller.security import ServerTls

METRICS_AUTH = ("auto", "server", "none")

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _ThreadingWsgiServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def shutdown(self) -> None:
        """Stop serving and close the listening socket."""
        super().shutdown()
        self.server_close()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (one line per scrape would drown the process's log)."""


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); an empty host is 127.0.0.1 (local by default)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit():
        raise ValueError(f"metrics address must be host:port, got {address!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def guarded(app: WsgiApp, token: str | None) -> WsgiApp:
    """``app`` behind ``Authorization: Bearer <token>`` (constant-time); ``app`` without one."""
    if token is None:
        return app
    expected = f"Bearer {token}".encode()

    def check(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        given = str(environ.get("HTTP_AUTHORIZATION", "")).encode()
        if hmac.compare_digest(given, expected):
            return app(environ, start_response)
        start_response("401 Unauthorized", [("WWW-Authenticate", "Bearer")])
        return [b"missing or invalid bearer token\n"]

    return check


def _ssl_context(tls: ServerTls) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(tls.cert), str(tls.key))
    if tls.client_ca is not None:
        ctx.load_verify_locations(str(tls.client_ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def serve_metrics(
    registry: CollectorRegistry,
    address: str,
    *,
    auth: str = "auto",
    tls: ServerTls | None = None,
    token: str | None = None,
) -> WSGIServer:
    """Serve ``registry`` at ``/metrics`` of ``address`` (port 0 = any) from a daemon thread,
    guarded by ``auth`` (module docstring; ``tls``/``token`` are the gRPC server's).

    ``server.server_port`` is the bound port, ``server.shutdown()`` stops it."""
    if auth not in METRICS_AUTH:
        raise ValueError(f"metrics auth must be one of {METRICS_AUTH}, got {auth!r}")
    host, port = split_address(address)
    secure = auth == "server" or (auth == "auto" and not is_loopback(host))
    app = guarded(make_wsgi_app(registry), token if secure else None)
    server = make_server(host, port, app, _ThreadingWsgiServer, handler_class=_QuietHandler)
    if secure and tls is not None:
        server.socket = _ssl_context(tls).wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
