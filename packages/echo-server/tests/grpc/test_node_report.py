"""The acceptance numbers a node reports to its controller, checked against the engine's own."""

from __future__ import annotations

import asyncio

from echo_core.sampling import SamplingParams
from echo_gating.policy import GatePolicy
from echo_scheduler.policies import make_policy
from echo_server.drafting import NgramDrafter
from echo_server.engine import Engine, EngineConfig, GenerationRequest
from echo_server.grpc.lease_client import LeaseClient
from echo_server.model.loader import LoadedModel
from echo_server.node.drift import GateObserver
from echo_server.node.engine_thread import EngineThread
from echo_server.node.lease import NodeIdentity

# Prompt lookup accepts drafts on text that repeats itself, so accepted tokens are > 0.
PROMPT = "Repeat exactly, five times: the cat sat on the mat. the cat sat on the mat."


def test_reported_mean_accepted_length_counts_request_steps(smollm: LoadedModel) -> None:
    """Four requests decode side by side: the report's mean accepted length is the engine's
    (accepted + request-steps) / request-steps, not one that divides by engine steps."""
    engine = Engine(
        smollm.model,
        smollm.tokenizer,
        make_policy("echo"),
        NgramDrafter(),
        EngineConfig(budget=16, max_batch=4, kv_slots=2048),
    )

    async def scenario() -> None:
        worker = EngineThread(engine, max_waiting=4)
        worker.start()
        client = LeaseClient(
            "127.0.0.1:1", NodeIdentity("n", k_max=16), worker, GateObserver(GatePolicy.none())
        )
        try:
            params = SamplingParams(temperature=0.0, max_tokens=24)
            streams = [
                worker.submit(GenerationRequest(f"r{i}", prompt=PROMPT, params=params), 0.0)
                for i in range(4)
            ]
            for stream in streams:
                async for _ in stream:
                    pass
            await worker.call(lambda: None)  # the engine thread has refreshed the snapshot
            report = client._report()
        finally:
            await client.close()
            await worker.close()
        engine_totals = engine.metrics.acceptance.totals
        assert engine_totals.accepted > 0, "the workload must accept drafts to tell the two apart"
        assert report.accepted == engine_totals.accepted
        assert report.verified == engine_totals.verified
        assert report.steps < engine_totals.request_steps  # batched: steps < request-steps
        assert report.mean_accepted_length == engine_totals.mean_accepted_length
        assert 1.0 < report.mean_accepted_length < 1.0 + report.accepted / report.steps

    asyncio.run(asyncio.wait_for(scenario(), timeout=120))
