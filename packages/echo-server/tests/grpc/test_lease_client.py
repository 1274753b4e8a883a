"""A node's lease client against an in-process controller: follow, fall back, re-register,
back off from an id conflict."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from structlog.testing import capture_logs

from echo_controller.convert import NODE_ID
from echo_controller.lease_table import LeaseConfig
from echo_gating.policy import GatePolicy
from echo_gating.testing import SyntheticSpec, synthetic_records
from echo_scheduler.policies import make_policy
from echo_server.drafting import NgramDrafter
from echo_server.engine import Engine, EngineConfig
from echo_server.grpc.backoff import Backoff
from echo_server.grpc.lease_client import FALLBACK_K, LeaseClient
from echo_server.model.loader import LoadedModel
from echo_server.node.drift import GateObserver
from echo_server.node.engine_thread import EngineThread
from echo_server.node.identity import bound_node_id
from echo_server.node.lease import NodeIdentity

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


def test_a_node_follows_its_lease_falls_back_to_k_zero_at_ttl_and_re_registers(
    smollm: LoadedModel,
) -> None:
    """While the controller is down (and while a restarted one is quarantined) the node serves
    with K = 0, never with its local --budget 8: the pool's sum of K stays <= G."""

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

            await ctl.stop()  # the controller dies: the lease holds until its TTL, then K = 0
            await eventually(lambda: client.lease is None)
            await eventually(lambda: worker.snapshot.budget_k == FALLBACK_K == 0)

            ctl = await start_controller(
                CONFIG, listen=f"127.0.0.1:{port}", incarnation=11, quarantine=True
            )
            await eventually(lambda: client.registrations == 2 and client.lease is not None)
            again = client.lease
            assert again is not None
            assert again.epoch > first.epoch
            assert again.budget_k == 0  # the restarted controller's quarantine
            await eventually(lambda: worker.snapshot.budget_k == 5)
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            await client.close()
            await ctl.stop()
            await worker.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=90))


def test_two_nodes_with_one_id_back_off_and_name_the_conflict(smollm: LoadedModel) -> None:
    """Each replaced registration costs the loser a jittered, growing wait (without backoff the
    two clients re-registered about 150 times a second)."""

    async def scenario() -> int:
        ctl = await start_controller(CONFIG)
        worker = _worker(smollm)
        worker.start()
        target = f"127.0.0.1:{ctl.server.port}"
        clients = [
            LeaseClient(
                target,
                IDENTITY,
                worker,
                GateObserver(GatePolicy.none()),
                conflict_backoff=Backoff(0.2, 0.8, random.Random(seed)),
            )
            for seed in (1, 2)
        ]
        runs = [asyncio.create_task(c.run()) for c in clients]
        try:
            await eventually(lambda: sum(c.conflicts for c in clients) >= 3)
            registrations = sum(c.registrations for c in clients)
            await asyncio.sleep(2.0)  # a window in which the old code registered ~300 times
            return sum(c.registrations for c in clients) - registrations
        finally:
            for run in runs:
                run.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
            for client in clients:
                await client.close(deregister=False)
            await ctl.stop()
            await worker.close()

    with capture_logs() as logs:
        during = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    # waits >= 0.1, 0.2, 0.4, 0.4 ... s per client: at most ~10 registrations in the 2 s window
    assert during <= 12, during
    conflicts = [e for e in logs if e["event"] == "node_id_conflict"]
    assert conflicts
    assert conflicts[0]["node_id"] == IDENTITY.node_id
    assert "--node-id" in conflicts[0]["hint"]


def test_the_conflict_backoff_grows_with_jitter_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(0.5, 4.0, random.Random(0))
    waits = [backoff.next() for _ in range(6)]
    for n, wait in enumerate(waits, start=1):
        ceiling = min(4.0, 0.5 * 2 ** (n - 1))
        assert ceiling / 2 <= wait <= ceiling
    assert len(set(waits)) == len(waits)  # jittered
    backoff.reset()
    assert backoff.next() <= 0.5


def test_the_retry_backoff_without_jitter_doubles_to_its_cap() -> None:
    retry = Backoff(0.1, 2.0, jitter=False)
    assert [retry.next() for _ in range(7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
    retry.reset()
    assert retry.next() == 0.1


def test_the_default_node_id_comes_from_the_bound_port_not_the_listen_text() -> None:
    a = bound_node_id("127.0.0.1:0", 40001, "host")
    b = bound_node_id("127.0.0.1:0", 40002, "host")
    assert (a, b) == ("host/127.0.0.1:40001", "host/127.0.0.1:40002")
    assert NODE_ID.fullmatch(bound_node_id("[::1]:0", 7, "h"))
    long = bound_node_id(":0", 65535, "x" * 300)
    assert len(long) == 128
    assert long.endswith(":65535")
    with pytest.raises(ValueError, match="bound port"):
        bound_node_id("127.0.0.1:0", 0)


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
