"""The budget controller process (``echo-controller``): service, expiry loop, metrics.

The incarnation (high half of every epoch) is the start time in seconds, or one more than the
last one recorded in ``state_file`` if that is larger: epochs grow across restarts even when the
clock does not, so a restarted controller's leases fence the old ones.

A controller that may be a restart (its ``state_file`` records an earlier incarnation, or there
is no state file to tell) grants K = 0 for ``ttl + slack`` after it starts, while its
predecessor's leases may still be in use (:mod:`echo_controller.lease_table`). A first start
with a fresh state file grants at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from wsgiref.simple_server import WSGIServer

import structlog

from echo_controller.calibration import PoolConfig, calibration_pool
from echo_controller.lease_table import LeaseConfig, LeaseTable
from echo_controller.metrics import ControllerMetrics
from echo_controller.server import (
    GrpcServer,
    ServerConfig,
    start_metrics,
    start_server,
    write_ready_file,
)
from echo_controller.service import SERVICE_NAME, BudgetControllerService
from echo_proto.budget.v1 import budget_pb2_grpc

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    server: ServerConfig
    lease: LeaseConfig
    # None: no calibration sharing (echo_controller.calibration); a pool needs echo-gating.
    calibration: PoolConfig | None = field(default_factory=PoolConfig)
    metrics_listen: str | None = None
    ready_file: Path | None = None
    state_file: Path | None = None


@dataclass(slots=True)
class RunningController:
    """A started controller: its gRPC server, service, metrics and expiry task."""

    server: GrpcServer
    service: BudgetControllerService
    metrics: ControllerMetrics
    incarnation: int
    expiry: asyncio.Task[None]
    http: WSGIServer | None = None  # the /metrics endpoint, if any

    async def stop(self, grace_s: float | None = 1.0) -> None:
        self.expiry.cancel()
        await asyncio.gather(self.expiry, return_exceptions=True)
        await self.server.stop(grace_s)
        if self.http is not None:
            self.http.shutdown()


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


async def start_controller(
    config: ControllerConfig, incarnation: int | None = None, quarantine: bool | None = None
) -> RunningController:
    """Bind and start (``incarnation``: None = from the clock and ``state_file``; ``quarantine``:
    None = unless the state file shows a first start, module docstring).

    Raises :class:`~echo_controller.calibration.CalibrationUnavailableError` before anything is
    bound or written when calibration sharing is enabled without echo-gating."""
    pool = calibration_pool(config.calibration) if config.calibration is not None else None
    metrics = ControllerMetrics()
    if quarantine is None:
        quarantine = config.state_file is None or config.state_file.is_file()
    if incarnation is None:
        incarnation = next_incarnation(config.state_file, time.time())
    lease = config.lease
    until = time.monotonic() + (lease.ttl_ms + lease.slack_ms) / 1000 if quarantine else None
    table = LeaseTable(lease, incarnation, quarantine_until=until)
    service = BudgetControllerService(table, pool, metrics)
    server = await start_server(
        config.server,
        lambda s: budget_pb2_grpc.add_BudgetControllerServicer_to_server(service, s),
        [SERVICE_NAME],
        on_refused=lambda code: metrics.refused.labels(code).inc(),
    )
    http = start_metrics(metrics.registry, config.metrics_listen, config.server)
    period_s = min(config.lease.ttl_ms, config.lease.report_interval_ms) / 4000
    expiry = asyncio.create_task(service.expire_loop(period_s))
    return RunningController(server, service, metrics, incarnation, expiry, http)


async def serve_controller(config: ControllerConfig, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set."""
    running = await start_controller(config)
    ports = {
        "grpc_port": running.server.port,
        "metrics_port": running.http.server_port if running.http else 0,
        "health_port": running.server.health_port,
    }
    if config.ready_file is not None:
        write_ready_file(config.ready_file, **ports)
    log.info(
        "controller_serving",
        incarnation=running.incarnation,
        quarantine_s=max(0.0, (running.service.table.quarantine_until or 0) - time.monotonic()),
        calibration=running.service.calibration is not None,
        **ports,
    )
    try:
        await stop.wait()
    finally:
        await running.stop()
        log.info("controller_stopped")
