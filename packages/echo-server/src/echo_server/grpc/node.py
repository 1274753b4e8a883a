"""The serving node process (``echo-sd serve``): engine thread, generation API, lease client,
gate observer and metrics, with a graceful shutdown.

Shutdown (SIGTERM / SIGINT): health turns NOT_SERVING, new requests get UNAVAILABLE, in-flight
requests may finish within ``grace_s`` and are cancelled after it (their clients see
FINISH_REASON_ABORTED); the lease is released (Deregister) and the servers stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from echo_controller.security import ClientTls
from echo_controller.server import ServerConfig, start_metrics, start_server, write_ready_file
from echo_gating.policy import GatePolicy
from echo_proto.serving.v1 import serving_pb2_grpc
from echo_server.engine import Engine
from echo_server.engine.memory import memory_report, trim_heap
from echo_server.grpc.convert import RequestLimits
from echo_server.grpc.engine_thread import EngineThread
from echo_server.grpc.gate_drift import GateObserver
from echo_server.grpc.generation_service import SERVICE_NAME, GenerationService
from echo_server.grpc.lease import NodeIdentity, ReceivedLease
from echo_server.grpc.lease_client import LeaseClient
from echo_server.grpc.metrics import NodeMetrics
from echo_server.grpc.node_identity import bound_node_id
from echo_server.http.app import HttpState, create_app
from echo_server.http.server import HttpServer

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class NodeConfig:
    server: ServerConfig
    limits: RequestLimits
    max_waiting: int = 32
    grace_s: float = 10.0
    metrics_listen: str | None = None
    ready_file: Path | None = None
    controller: str | None = None  # host:port of the budget controller; None = standalone
    controller_tls: ClientTls | None = None
    controller_token: str | None = None
    observe_interval_s: float = 1.0  # how often the gate observer reads the engine's records
    window_s: float = 10.0
    grpc: bool = True  # serve the gRPC generation API on server.listen
    http_listen: str | None = None  # host:port of the OpenAI-compatible HTTP API; None = off
    model_name: str = "echo"  # the model id the HTTP API serves (GET /v1/models)


async def serve_node(
    engine: Engine, identity: NodeIdentity, config: NodeConfig, stop: asyncio.Event
) -> None:
    """Serve until ``stop`` is set, then shut down gracefully."""
    trimmed = trim_heap()
    held = memory_report(engine.model, engine.kv.storage, engine.drafter)
    log.info("node_memory", trimmed_mib=round(trimmed / 2**20, 1), **held.log_fields())
    metrics = NodeMetrics()
    worker = EngineThread(
        engine,
        max_waiting=config.max_waiting,
        window_s=config.window_s,
        records_meta={"target": identity.target, "drafter": identity.drafter},
        on_step=metrics.on_step,
        on_finish=metrics.on_finish,
    )
    worker.start()
    observer = GateObserver(engine.policy.active_gate() or GatePolicy.none())
    client = (
        LeaseClient(
            config.controller,
            identity,
            worker,
            observer,
            tls=config.controller_tls,
            token=config.controller_token,
            metrics=metrics,
        )
        if config.controller
        else None
    )

    def lease() -> ReceivedLease | None:
        return client.lease if client is not None else None

    service = GenerationService(worker, config.limits, identity.node_id, lease, metrics)
    server = (
        await start_server(
            config.server,
            lambda s: serving_pb2_grpc.add_GenerationServiceServicer_to_server(service, s),
            [SERVICE_NAME],
            on_refused=lambda code: metrics.refused.labels(code).inc(),
        )
        if config.grpc
        else None
    )
    http_state = HttpState(
        worker,
        config.limits,
        config.model_name,
        metrics,
        token=config.server.token,
        max_body_bytes=config.server.max_message_bytes,
    )
    web = (
        await HttpServer.start(create_app(http_state), config.http_listen, config.server.tls)
        if config.http_listen
        else None
    )
    http_state.serving = True
    if not identity.node_id:  # from the bound port: unique by construction (node_identity)
        port = server.port if server else web.port if web else 0
        listen = config.server.listen if server else config.http_listen or ""
        identity = replace(identity, node_id=bound_node_id(listen, port))
        service.node_id = identity.node_id
        if client is not None:
            client.identity = identity
    http = start_metrics(metrics.registry, config.metrics_listen, config.server)
    tasks = [asyncio.create_task(_observe(worker, observer, metrics, config.observe_interval_s))]
    if client is not None:
        tasks.append(asyncio.create_task(client.run()))
    ports = {
        "grpc_port": server.port if server else 0,
        "http_port": web.port if web else 0,
        "metrics_port": http.server_port if http else 0,
        "health_port": server.health_port if server else 0,
    }
    if config.ready_file is not None:
        write_ready_file(config.ready_file, **ports)
    log.info("node_serving", node_id=identity.node_id, controller=config.controller, **ports)
    try:
        await stop.wait()
    finally:
        log.info("node_draining", in_flight=worker.in_flight, grace_s=config.grace_s)
        http_state.serving = False
        if server is not None:
            await server.set_serving(False)
        cancelled = await worker.drain(config.grace_s)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        if server is not None:
            await server.stop(1.0)
        if web is not None:
            await web.stop()
        await worker.close()
        if http is not None:
            http.shutdown()
        log.info("node_stopped", cancelled=cancelled)


async def _observe(
    worker: EngineThread, observer: GateObserver, metrics: NodeMetrics, period_s: float
) -> None:
    """Feed the engine's new warm-up records to the gate observer; refresh the gauges."""
    while True:
        await asyncio.sleep(period_s)
        records = await worker.take_records()
        if records is not None:
            observer.observe(records)
            metrics.on_drift(observer.drift())
        metrics.on_snapshot(worker.snapshot)
