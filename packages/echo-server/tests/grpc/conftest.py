"""In-process serving nodes on loopback (port 0) around the session's embedded model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import grpc
import pytest

from echo_controller import process
from echo_controller.calibration import PoolConfig
from echo_controller.lease_table import LeaseConfig
from echo_controller.process import ControllerConfig, RunningController
from echo_controller.server import GrpcServer, ServerConfig, start_server
from echo_proto.serving.v1 import serving_pb2 as spb
from echo_proto.serving.v1 import serving_pb2_grpc
from echo_scheduler.policies import make_policy
from echo_server.drafting import Drafter, NgramDrafter
from echo_server.engine import Engine, EngineConfig
from echo_server.grpc.generation_service import SERVICE_NAME, GenerationService
from echo_server.model.loader import LoadedModel
from echo_server.node.engine_thread import EngineThread
from echo_server.node.limits import RequestLimits
from echo_server.node.metrics import NodeMetrics

CALL_TIMEOUT_S = 60.0


@dataclass
class InProcessNode:
    server: GrpcServer
    worker: EngineThread
    channel: grpc.aio.Channel
    stub: serving_pb2_grpc.GenerationServiceAsyncStub
    metrics: NodeMetrics

    async def wait_until_idle(self, deadline_s: float = 30.0) -> spb.GetStatsResponse:
        """Poll GetStats until nothing runs or waits (the engine freed every slot)."""
        end = time.monotonic() + deadline_s
        while True:
            stats = await self.stub.GetStats(spb.GetStatsRequest(), timeout=CALL_TIMEOUT_S)
            if stats.running == 0 and stats.waiting == 0 and self.worker.in_flight == 0:
                return stats
            assert time.monotonic() < end, f"still busy: {stats}"
            await asyncio.sleep(0.05)


NodeFactory = Callable[..., AbstractAsyncContextManager[InProcessNode]]


@pytest.fixture
def in_process_node(smollm: LoadedModel) -> NodeFactory:
    @asynccontextmanager
    async def start(
        max_batch: int = 2,
        max_waiting: int = 4,
        token: str | None = None,
        budget: int = 8,
        drafter: Drafter | None = None,
    ) -> AsyncIterator[InProcessNode]:
        engine = Engine(
            smollm.model,
            smollm.tokenizer,
            make_policy("echo"),
            drafter or NgramDrafter(),
            EngineConfig(budget=budget, max_batch=max_batch, kv_slots=2048),
        )
        metrics = NodeMetrics()
        worker = EngineThread(engine, max_waiting=max_waiting, on_step=metrics.on_step)
        worker.start()
        limits = RequestLimits(vocab_size=smollm.model.config.vocab_size, policy="echo")
        service = GenerationService(worker, limits, "test-node", metrics=metrics)
        server = await start_server(
            ServerConfig("127.0.0.1:0", token=token),
            lambda s: serving_pb2_grpc.add_GenerationServiceServicer_to_server(service, s),
            [SERVICE_NAME],
        )
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        try:
            yield InProcessNode(
                server, worker, channel, serving_pb2_grpc.GenerationServiceStub(channel), metrics
            )
        finally:
            await channel.close()
            await worker.drain(0.0)
            await server.stop(None)
            await worker.close()

    return start


async def start_controller(
    config: LeaseConfig,
    *,
    listen: str = "127.0.0.1:0",
    incarnation: int = 1,
    quarantine: bool = False,
) -> RunningController:
    """An in-process budget controller (echo-controller) with calibration sharing;
    ``quarantine``: grant K = 0 for TTL + slack, as a restarted controller does."""
    controller = ControllerConfig(ServerConfig(listen), config, PoolConfig())
    return await process.start_controller(
        controller, incarnation=incarnation, quarantine=quarantine
    )


async def eventually(check: Callable[[], bool], deadline_s: float = 20.0) -> None:
    """Poll ``check`` on the event loop until it holds (AssertionError at the deadline)."""
    end = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < end, "condition not reached before the deadline"
        await asyncio.sleep(0.02)
