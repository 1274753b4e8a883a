"""An in-process controller on loopback (port 0) with a client stub.

The calibration-sharing tests need echo-gating (``echo-controller[calibration]``); without it
they are not collected and the rest runs.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from echo_controller import process
from echo_controller.calibration import PoolConfig
from echo_controller.lease_table import LeaseConfig
from echo_controller.process import ControllerConfig, RunningController
from echo_controller.server import ServerConfig
from echo_controller.service import BudgetControllerService
from echo_proto.budget.v1 import budget_pb2_grpc

_GATING = all(importlib.util.find_spec(m) for m in ("torch", "echo_gating"))
collect_ignore = [] if _GATING else ["test_calibration_pool.py"]


@dataclass
class InProcessController:
    running: RunningController
    channel: grpc.aio.Channel
    stub: budget_pb2_grpc.BudgetControllerAsyncStub

    @property
    def service(self) -> BudgetControllerService:
        return self.running.service

    async def stop(self) -> None:
        await self.channel.close()
        await self.running.stop(None)


async def start_controller(
    config: LeaseConfig,
    *,
    incarnation: int = 1,
    token: str | None = None,
    calibration: PoolConfig | None = None,
    quarantine: bool = False,
) -> InProcessController:
    """A controller with ``calibration`` sharing (None: without it); ``quarantine``: grant
    K = 0 for TTL + slack, as a restarted controller does."""
    running = await process.start_controller(
        ControllerConfig(ServerConfig("127.0.0.1:0", token=token), config, calibration),
        incarnation=incarnation,
        quarantine=quarantine,
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.server.port}")
    return InProcessController(running, channel, budget_pb2_grpc.BudgetControllerStub(channel))


async def eventually(check: Callable[[], bool], deadline_s: float = 20.0) -> None:
    """Poll ``check`` on the event loop until it holds (AssertionError at the deadline)."""
    end = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < end, "condition not reached before the deadline"
        await asyncio.sleep(0.02)
