"""A node's lease client against an in-process controller: follow, fall back, re-register."""

from __future__ import annotations

import asyncio

import torch

from echo_controller.lease_table import LeaseConfig
from echo_gating.policy import GatePolicy
from echo_gating.testing import SyntheticSpec, synthetic_records
from echo_scheduler.policies import make_policy
from echo_server.drafting import NgramDrafter
from echo_server.engine import Engine, EngineConfig
from echo_server.grpc.engine_thread import EngineThread
from echo_server.grpc.gate_drift import GateObserver
from echo_server.grpc.lease import NodeIdentity
from echo_server.grpc.lease_client import LeaseClient
from echo_server.model.loader import LoadedModel

from .conftest import eventually, start_controller

CONFIG = LeaseConfig(global_budget=5, ttl_ms=800, slack_ms=100, report_interval_ms=100)
IDENTITY = NodeIdentity("node-a", k_max=8, pool="dp", target="t", drafter="ngram")


def _worker(smollm: LoadedModel) -> EngineThread:
    engine = Engine(
        smollm.model,
        smollm.tokenizer,
        make_policy("echo"),
        NgramDrafter(),
        EngineConfig(budget=8, max_batch=2, kv_slots=1024),
    )
    return EngineThread(engine, max_waiting=2)


def test_a_node_follows_its_lease_falls_back_at_ttl_and_re_registers(smollm: LoadedModel) -> None:
    async def scenario() -> None:
        ctl = await start_controller(CONFIG, incarnation=10)
        port = ctl.server.port
        worker = _worker(smollm)
        worker.start()
        client = LeaseClient(f"127.0.0.1:{port}", IDENTITY, worker, GateObserver(GatePolicy.none()))
        run = asyncio.create_task(client.run())
        try:
            await eventually(lambda: client.lease is not None and worker.snapshot.budget_k == 5)
            first = client.lease
            assert first is not None
            assert first.budget_k == 5

            await ctl.stop()  # the controller dies: the lease holds until its TTL, then local K
            await eventually(lambda: client.lease is None and worker.snapshot.budget_k == 8)

            ctl = await start_controller(CONFIG, listen=f"127.0.0.1:{port}", incarnation=11)
            await eventually(lambda: client.registrations == 2 and client.lease is not None)
            again = client.lease
            assert again is not None
            assert again.epoch > first.epoch
            await eventually(lambda: worker.snapshot.budget_k == 5)
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            await client.close()
            await ctl.stop()
            await worker.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=90))


def test_a_pushed_gate_policy_replaces_the_engines_gates(smollm: LoadedModel) -> None:
    pushed = GatePolicy.sparse({2: 0.25}, max_depth=8, version="pushed-v2")

    async def scenario() -> None:
        ctl = await start_controller(CONFIG)
        worker = _worker(smollm)
        worker.start()
        observer = GateObserver(GatePolicy.none())
        client = LeaseClient(f"127.0.0.1:{ctl.server.port}", IDENTITY, worker, observer)
        run = asyncio.create_task(client.run())
        try:
            await eventually(lambda: client.lease is not None)
            assert ctl.service.calibration is not None
            ctl.service.calibration.install(("t", "ngram"), pushed, now=0.0)
            await eventually(lambda: worker.snapshot.gate_policy_version == "pushed-v2")
            assert observer.gate.version == "pushed-v2"
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            await client.close()
            await ctl.stop()
            await worker.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=60))


def test_gate_observer_ships_each_record_once_and_keeps_a_history() -> None:
    observer = GateObserver(GatePolicy.sparse({2: 0.3}, max_depth=8), history=100, ship_limit=50)
    records = synthetic_records(SyntheticSpec(), torch.Generator().manual_seed(0), 2, 4)
    observer.observe(records)

    shipped = observer.take_unsent()
    assert shipped is not None
    assert len(shipped) == len(records)
    assert observer.take_unsent() is None
    assert observer.curve(running=1, waiting=0, k_max=4)  # from the history
    assert observer.drift().policy_version == observer.gate.version
