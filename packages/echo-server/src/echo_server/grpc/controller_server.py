"""The budget controller process (``echo-sd controller``): service, expiry loop, metrics.

The incarnation (high half of every epoch) is the start time in seconds, or one more than the
last one recorded in ``state_file`` if that is larger: epochs grow across restarts even when the
clock does not, so a restarted controller's leases fence the old ones.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from echo_proto.budget.v1 import budget_pb2_grpc
from echo_server.grpc.calibration_pool import CalibrationPool, PoolConfig
from echo_server.grpc.controller import SERVICE_NAME, BudgetControllerService
from echo_server.grpc.lease_table import LeaseConfig, LeaseTable
from echo_server.grpc.metrics import ControllerMetrics, serve_metrics
from echo_server.grpc.server import ServerConfig, start_server, write_ready_file

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    server: ServerConfig
    lease: LeaseConfig
    calibration: PoolConfig = field(default_factory=PoolConfig)
    metrics_listen: str | None = None
    ready_file: Path | None = None
    state_file: Path | None = None


def next_incarnation(state_file: Path | None, now_s: float) -> int:
    """The incarnation of a starting controller (module docstring); records it in the file."""
    incarnation = int(now_s)
    if state_file is not None:
        if state_file.is_file():
            text = state_file.read_text(encoding="utf-8").strip()
            if text.isdigit():
                incarnation = max(incarnation, int(text) + 1)
        state_file.write_text(f"{incarnation}\n", encoding="utf-8")
    return incarnation


async def serve_controller(config: ControllerConfig, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set."""
    metrics = ControllerMetrics()
    incarnation = next_incarnation(config.state_file, time.time())
    table = LeaseTable(config.lease, incarnation)
    service = BudgetControllerService(table, CalibrationPool(config.calibration), metrics)
    server = await start_server(
        config.server,
        lambda s: budget_pb2_grpc.add_BudgetControllerServicer_to_server(service, s),
        [SERVICE_NAME],
        on_refused=lambda _method: metrics.refused.labels("UNAUTHENTICATED").inc(),
    )
    http = serve_metrics(metrics.registry, config.metrics_listen) if config.metrics_listen else None
    period_s = min(config.lease.ttl_ms, config.lease.report_interval_ms) / 4000
    expiry = asyncio.create_task(service.expire_loop(period_s))
    ports = {"grpc_port": server.port, "metrics_port": http.server_port if http else 0}
    if config.ready_file is not None:
        write_ready_file(config.ready_file, **ports)
    log.info("controller_serving", incarnation=incarnation, **ports)
    try:
        await stop.wait()
    finally:
        expiry.cancel()
        await asyncio.gather(expiry, return_exceptions=True)
        await server.stop(1.0)
        if http is not None:
            http.shutdown()
        log.info("controller_stopped")
