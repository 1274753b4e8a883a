"""What both processes share: a grpc.aio server with health, reflection, auth and size limits,
an optional health-only port for probes, the metrics endpoint, and the ready file through which a
launcher learns the bound ports.

Interceptor order: the bearer token first (before the method is even looked up), then the
message guard (malformed / oversized requests, :mod:`echo_controller.message_guard`).

Health under mTLS: the main port's TLS handshake needs a client certificate before any method
runs, health included. ``health_listen`` is the explicit choice for probes that have none: a
second port serving only ``grpc.health.v1.Health`` (same status as the main port), plaintext,
without token; bind it to loopback or a pod-local address. Without it, probes present a client
certificate (no token needed either way).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]  # no stubs
from grpc_health.v1._async import HealthServicer  # type: ignore[import-untyped]  # no stubs
from grpc_reflection.v1alpha import reflection  # type: ignore[import-untyped]  # no stubs
from prometheus_client import CollectorRegistry

from echo_controller.message_guard import MessageGuardInterceptor, server_receive_limit
from echo_controller.metrics_http import serve_metrics
from echo_controller.security import BearerTokenInterceptor, ServerTls, add_port, message_options

HEALTH_SERVICE = "grpc.health.v1.Health"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    listen: str  # host:port, port 0 = any free port
    tls: ServerTls | None = None
    token: str | None = None  # bearer token required on every call but health checks
    max_message_bytes: int = 4 * 1024 * 1024
    health_listen: str | None = None  # host:port of a plaintext health-only port (module doc)
    metrics_auth: str = "auto"  # echo_controller.metrics_http: auto, server or none


class GrpcServer:
    """A started server; ``port`` is the bound port, ``health_port`` the health-only one (0:
    none)."""

    def __init__(self, server: grpc.aio.Server, port: int, services: Sequence[str]) -> None:
        self.server, self.port = server, port
        self._health = HealthServicer()
        self._services = ["", *services]
        self._health_server: grpc.aio.Server | None = None
        self.health_port = 0
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)

    async def start_health_port(self, address: str) -> None:
        """Serve this server's health status, and nothing else, on ``address`` (plaintext)."""
        server = grpc.aio.server(options=message_options(4096))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        self.health_port = add_port(server, address, None)
        await server.start()
        self._health_server = server

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in self._services:
            await self._health.set(name, status)

    async def stop(self, grace_s: float | None) -> None:
        await self._health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
        if self._health_server is not None:
            await self._health_server.stop(None)


async def start_server(
    config: ServerConfig,
    add_services: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    on_refused: Callable[[str], None] | None = None,
) -> GrpcServer:
    """Build, bind and start a server whose services ``add_services`` registers;
    ``on_refused(code name)`` counts every call refused by the token or the message guard."""
    limit = config.max_message_bytes
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if config.token:
        interceptors.append(BearerTokenInterceptor(config.token, on_refused))
    interceptors.append(MessageGuardInterceptor(limit, on_refused))
    server = grpc.aio.server(
        interceptors=interceptors, options=message_options(limit, server_receive_limit(limit))
    )
    add_services(server)
    port = add_port(server, config.listen, config.tls)
    wrapped = GrpcServer(server, port, service_names)
    reflection.enable_server_reflection(
        [*service_names, HEALTH_SERVICE, reflection.SERVICE_NAME], server
    )
    await server.start()
    if config.health_listen:
        await wrapped.start_health_port(config.health_listen)
    await wrapped.set_serving(True)
    return wrapped


def start_metrics(
    registry: CollectorRegistry, address: str | None, config: ServerConfig
) -> WSGIServer | None:
    """The ``/metrics`` endpoint at ``address`` (None: none), guarded like ``config``'s server
    as ``config.metrics_auth`` says (:mod:`echo_controller.metrics_http`)."""
    if not address:
        return None
    return serve_metrics(
        registry, address, auth=config.metrics_auth, tls=config.tls, token=config.token
    )


def write_ready_file(path: Path, **ports: int) -> None:
    """Atomically write ``{"pid": ..., **ports}`` as JSON (a launcher polls for it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **ports}), encoding="utf-8")
    tmp.replace(path)
