"""The serving node process (``echo-sd serve``): engine thread, generation API, lease client,
gate observer and metrics, with a graceful shutdown.

Shutdown (SIGTERM / SIGINT): health turns NOT_SERVING, new requests get UNAVAILABLE, in-flight
requests may finish within ``grace_s`` and are cancelled after it (their clients see
FINISH_REASON_ABORTED); the lease is released (Deregister) and the servers stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path

import structlog

from echo_controller.metrics import serve_metrics
from echo_controller.security import ClientTls
from echo_controller.server import ServerConfig, start_server, write_ready_file
from echo_gating.policy import GatePolicy
from echo_proto.serving.v1 import serving_pb2_grpc
from echo_server.engine import Engine
from echo_server.grpc.convert import RequestLimits
from echo_server.grpc.engine_thread import EngineThread
from echo_server.grpc.gate_drift import GateObserver
from echo_server.grpc.generation_service import SERVICE_NAME, GenerationService
from echo_server.grpc.lease import NodeIdentity, ReceivedLease
from echo_server.grpc.lease_client import LeaseClient
from echo_server.grpc.metrics import NodeMetrics

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


async def serve_node(
    engine: Engine, identity: NodeIdentity, config: NodeConfig, stop: asyncio.Event
) -> None:
    """Serve until ``stop`` is set, then shut down gracefully."""
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
    server = await start_server(
        config.server,
        lambda s: serving_pb2_grpc.add_GenerationServiceServicer_to_server(service, s),
        [SERVICE_NAME],
        on_refused=lambda _method: metrics.refused.labels("UNAUTHENTICATED").inc(),
    )
    http = serve_metrics(metrics.registry, config.metrics_listen) if config.metrics_listen else None
    tasks = [asyncio.create_task(_observe(worker, observer, metrics, config.observe_interval_s))]
    if client is not None:
        tasks.append(asyncio.create_task(client.run()))
    ports = {"grpc_port": server.port, "metrics_port": http.server_port if http else 0}
    if config.ready_file is not None:
        write_ready_file(config.ready_file, **ports)
    log.info("node_serving", node_id=identity.node_id, controller=config.controller, **ports)
    try:
        await stop.wait()
    finally:
        log.info("node_draining", in_flight=worker.in_flight, grace_s=config.grace_s)
        await server.set_serving(False)
        cancelled = await worker.drain(config.grace_s)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        await server.stop(1.0)
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
