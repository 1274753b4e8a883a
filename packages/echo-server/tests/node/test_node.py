"""The transport-free node: its drift observer is fed by the engine's step reports, whatever
serves the requests (here none: the engine thread is driven directly)."""

from __future__ import annotations

import asyncio

from echo_core.sampling import SamplingParams
from echo_scheduler.policies import make_policy
from echo_server.drafting import NgramDrafter
from echo_server.engine import Engine, EngineConfig, GenerationRequest
from echo_server.model.loader import LoadedModel
from echo_server.node.lease import NodeIdentity, ReceivedLease
from echo_server.node.node import Node

# Prompt lookup accepts drafts on text that repeats itself, so draft nodes are verified.
PROMPT = "Repeat exactly, five times: the cat sat on the mat. the cat sat on the mat."


class _Follower:
    def __init__(self, identity: NodeIdentity) -> None:
        self.identity = identity
        self.runs = self.closes = 0

    @property
    def lease(self) -> ReceivedLease | None:
        return ReceivedLease(4, 1, 1000, "none", 0.0)

    async def run(self) -> None:
        self.runs += 1
        await asyncio.Event().wait()

    async def close(self) -> None:
        self.closes += 1


def test_step_reports_reach_the_drift_observer_without_a_transport(smollm: LoadedModel) -> None:
    engine = Engine(
        smollm.model,
        smollm.tokenizer,
        make_policy("echo"),
        NgramDrafter(),
        EngineConfig(budget=8, max_batch=2, kv_slots=2048),
    )

    async def scenario() -> None:
        node = Node(engine, NodeIdentity("", k_max=8, target="t", drafter="ngram"))
        follower = _Follower(node.identity)
        node.follow(follower)
        await node.start()
        node.set_node_id("host/127.0.0.1:1")
        assert follower.identity.node_id == "host/127.0.0.1:1"
        node.run_background()
        try:
            params = SamplingParams(temperature=0.0, max_tokens=16)
            stream = node.worker.submit(GenerationRequest("r", prompt=PROMPT, params=params), 0.0)
            async for _ in stream:
                pass
            await node.worker.call(lambda: None)  # every step report has been consumed
            assert node.observer.flush()
            assert not node.observer.flush()  # each record is observed once
            shipped = node.observer.take_unsent()
            assert shipped is not None
            assert len(shipped) > 0
            lease = node.lease()
            assert lease is not None
            assert lease.budget_k == 4
            await asyncio.sleep(0)
            assert follower.runs == 1
        finally:
            assert await node.drain(1.0) == 0
            await node.close()
        assert follower.closes == 1

    asyncio.run(asyncio.wait_for(scenario(), timeout=120))
