"""What both processes share: a grpc.aio server with health, reflection, auth and size limits,
and the ready file through which a launcher learns the bound ports."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]  # no stubs
from grpc_health.v1._async import HealthServicer  # type: ignore[import-untyped]  # no stubs
from grpc_reflection.v1alpha import reflection  # type: ignore[import-untyped]  # no stubs

from echo_controller.security import BearerTokenInterceptor, ServerTls, add_port, message_options

HEALTH_SERVICE = "grpc.health.v1.Health"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    listen: str  # host:port, port 0 = any free port
    tls: ServerTls | None = None
    token: str | None = None  # bearer token required on every call but health checks
    max_message_bytes: int = 4 * 1024 * 1024


class GrpcServer:
    """A started server; ``port`` is the bound port."""

    def __init__(self, server: grpc.aio.Server, port: int, services: Sequence[str]) -> None:
        self.server, self.port = server, port
        self._health = HealthServicer()
        self._services = ["", *services]
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)

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


async def start_server(
    config: ServerConfig,
    add_services: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    on_refused: Callable[[str], None] | None = None,
) -> GrpcServer:
    """Build, bind and start a server whose services ``add_services`` registers."""
    interceptors = [BearerTokenInterceptor(config.token, on_refused)] if config.token else []
    server = grpc.aio.server(
        interceptors=interceptors, options=message_options(config.max_message_bytes)
    )
    add_services(server)
    port = add_port(server, config.listen, config.tls)
    wrapped = GrpcServer(server, port, service_names)
    reflection.enable_server_reflection(
        [*service_names, HEALTH_SERVICE, reflection.SERVICE_NAME], server
    )
    await server.start()
    await wrapped.set_serving(True)
    return wrapped


def write_ready_file(path: Path, **ports: int) -> None:
    """Atomically write ``{"pid": ..., **ports}`` as JSON (a launcher polls for it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **ports}), encoding="utf-8")
    tmp.replace(path)
