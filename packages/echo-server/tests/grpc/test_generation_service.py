"""The generation API in process: answers, status codes, cancellation, deadlines, shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]  # no stubs
from grpc_reflection.v1alpha import (  # type: ignore[import-untyped]  # no stubs
    reflection_pb2,
    reflection_pb2_grpc,
)

from echo_controller.security import auth_metadata
from echo_gating.policy import GatePolicy
from echo_proto.serving.v1 import serving_pb2 as spb
from echo_server.drafting import Drafter
from echo_server.grpc.generation_service import RETRY_PUSHBACK_KEY, SERVICE_NAME

from .conftest import CALL_TIMEOUT_S, NodeFactory

PROMPT = "List three colours of the rainbow."


def _request(max_tokens: int = 4, **kwargs: object) -> spb.GenerateRequest:
    sampling = spb.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return spb.GenerateRequest(text=PROMPT, chat=True, sampling=sampling, **kwargs)  # type: ignore[arg-type]


def test_generate_and_stream_give_the_same_greedy_answer(in_process_node: NodeFactory) -> None:
    async def scenario() -> None:
        async with in_process_node() as node:
            unary = await node.stub.Generate(_request(request_id="u"), timeout=CALL_TIMEOUT_S)
            events = [
                m
                async for m in node.stub.GenerateStream(
                    spb.GenerateStreamRequest(request=_request()), timeout=CALL_TIMEOUT_S
                )
            ]
            stats = await node.wait_until_idle()

        deltas = [m.delta for m in events[:-1]]
        final = events[-1].final
        assert [m.WhichOneof("event") for m in events] == ["delta"] * len(deltas) + ["final"]
        assert [t for d in deltas for t in d.token_ids] == list(unary.token_ids)
        assert "".join(d.text for d in deltas) == unary.text
        assert unary.request_id == "u"
        assert final.request_id
        assert unary.finish_reason == final.finish_reason == spb.FINISH_REASON_LENGTH
        assert unary.stats.output_tokens == final.stats.output_tokens == 4
        assert unary.stats.mean_accepted_length >= 1.0
        assert 0 < unary.stats.time_to_first_token_ms <= unary.stats.total_ms
        assert stats.steps_total > 0
        assert stats.output_tokens_total >= 8
        assert stats.policy == "echo"

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (spb.GenerateRequest(), "prompt"),
        (spb.GenerateRequest(text="hi", sampling=spb.SamplingParams(top_p=7.0)), "sampling.top_p"),
        (spb.GenerateRequest(token_ids=spb.TokenIds(ids=[10**9])), "token_ids.ids"),
    ],
)
def test_invalid_requests_get_invalid_argument_naming_the_field(
    in_process_node: NodeFactory, request_: spb.GenerateRequest, field: str
) -> None:
    async def scenario() -> None:
        async with in_process_node() as node:
            with pytest.raises(grpc.aio.AioRpcError) as unary:
                await node.stub.Generate(request_, timeout=CALL_TIMEOUT_S)
            with pytest.raises(grpc.aio.AioRpcError) as stream:
                async for _ in node.stub.GenerateStream(
                    spb.GenerateStreamRequest(request=request_), timeout=CALL_TIMEOUT_S
                ):
                    pass
        assert unary.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (unary.value.details() or "").startswith(f"{field}: ")
        assert stream.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (stream.value.details() or "").startswith(f"request.{field}: ")

    asyncio.run(scenario())


def test_a_prompt_longer_than_the_context_is_resource_exhausted(
    in_process_node: NodeFactory,
) -> None:
    async def scenario() -> grpc.aio.AioRpcError:
        async with in_process_node() as node:
            long = spb.GenerateRequest(token_ids=spb.TokenIds(ids=[1] * 3000))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await node.stub.Generate(long, timeout=CALL_TIMEOUT_S)
            await node.wait_until_idle()
            return info.value

    error = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "KV slots" in (error.details() or "") or "context" in (error.details() or "")


def test_full_queue_is_refused_with_a_retry_hint_and_a_cancelled_stream_frees_its_slot(
    in_process_node: NodeFactory,
) -> None:
    async def scenario() -> None:
        async with in_process_node(max_batch=1, max_waiting=0) as node:
            call = node.stub.GenerateStream(
                spb.GenerateStreamRequest(request=_request(max_tokens=200)), timeout=CALL_TIMEOUT_S
            )
            first = await call.read()
            assert isinstance(first, spb.GenerateStreamResponse)
            assert first.WhichOneof("event") == "delta"
            with pytest.raises(grpc.aio.AioRpcError) as full:
                await node.stub.Generate(_request(), timeout=CALL_TIMEOUT_S)
            assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            trailers = dict(full.value.trailing_metadata() or ())
            assert int(trailers[RETRY_PUSHBACK_KEY]) > 0
            call.cancel()
            stats = await node.wait_until_idle()
            assert stats.output_tokens_total < 200  # cancelled mid-stream, not finished
            again = await node.stub.Generate(_request(), timeout=CALL_TIMEOUT_S)
            assert again.finish_reason == spb.FINISH_REASON_LENGTH
            assert node.metrics.refused.labels("RESOURCE_EXHAUSTED")._value.get() == 1

    asyncio.run(scenario())


def test_an_expired_deadline_cancels_the_request_in_the_engine(
    in_process_node: NodeFactory,
) -> None:
    async def scenario() -> None:
        async with in_process_node() as node:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await node.stub.Generate(_request(max_tokens=500), timeout=1.0)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            stats = await node.wait_until_idle()
            assert stats.output_tokens_total < 500

    asyncio.run(scenario())


def test_draining_aborts_what_outlives_the_grace_period_and_admits_nothing(
    in_process_node: NodeFactory,
) -> None:
    async def scenario() -> None:
        async with in_process_node() as node:
            call = node.stub.GenerateStream(
                spb.GenerateStreamRequest(request=_request(max_tokens=200)), timeout=CALL_TIMEOUT_S
            )
            first = await call.read()
            drain = asyncio.create_task(node.worker.drain(grace_s=0.2))
            last = first
            while (message := await call.read()) is not grpc.aio.EOF:
                last = message
            assert await drain == 1
            assert isinstance(first, spb.GenerateStreamResponse)
            assert isinstance(last, spb.GenerateStreamResponse)
            assert last.final.finish_reason == spb.FINISH_REASON_ABORTED
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await node.stub.Generate(_request(), timeout=CALL_TIMEOUT_S)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(scenario())


def test_budget_override_and_gate_swap_apply_between_steps_of_a_running_request(
    in_process_node: NodeFactory,
) -> None:
    async def scenario() -> None:
        async with in_process_node(budget=8) as node:
            call = node.stub.GenerateStream(
                spb.GenerateStreamRequest(request=_request(max_tokens=12)), timeout=CALL_TIMEOUT_S
            )
            first = await call.read()
            assert isinstance(first, spb.GenerateStreamResponse)
            await node.worker.set_budget_override(3)
            gate = GatePolicy.sparse({2: 0.3}, max_depth=8, version="test-gate")
            assert await node.worker.set_gate(gate)
            stats = await node.stub.GetStats(spb.GetStatsRequest(), timeout=CALL_TIMEOUT_S)
            assert (stats.budget_k, stats.gate_policy_version) == (3, "test-gate")
            last = first
            while (message := await call.read()) is not grpc.aio.EOF:
                assert isinstance(message, spb.GenerateStreamResponse)
                last = message
            assert last.final.finish_reason == spb.FINISH_REASON_LENGTH
            assert last.final.stats.output_tokens == 12  # the swap dropped nothing
            await node.worker.set_budget_override(None)
            stats = await node.stub.GetStats(spb.GetStatsRequest(), timeout=CALL_TIMEOUT_S)
            assert stats.budget_k == 8

    asyncio.run(scenario())


def test_health_and_reflection_are_served_and_the_token_is_enforced(
    in_process_node: NodeFactory,
) -> None:
    async def scenario() -> None:
        async with in_process_node(token="s3cret") as node:
            health = health_pb2_grpc.HealthStub(node.channel)
            status = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await node.stub.GetStats(spb.GetStatsRequest(), timeout=CALL_TIMEOUT_S)
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as wrong:
                await node.stub.GetStats(
                    spb.GetStatsRequest(), metadata=auth_metadata("guess"), timeout=CALL_TIMEOUT_S
                )
            assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stats = await node.stub.GetStats(
                spb.GetStatsRequest(), metadata=auth_metadata("s3cret"), timeout=CALL_TIMEOUT_S
            )
            assert stats.node_id == "test-node"
            reflection = reflection_pb2_grpc.ServerReflectionStub(node.channel)
            ask = reflection_pb2.ServerReflectionRequest(list_services="")
            replies = reflection.ServerReflectionInfo(
                iter([ask]), metadata=auth_metadata("s3cret"), timeout=CALL_TIMEOUT_S
            )
            names = [s.name async for r in replies for s in r.list_services_response.service]
            assert SERVICE_NAME in names

    asyncio.run(scenario())


def test_a_request_whose_step_fails_gets_an_error_while_the_other_finishes(
    in_process_node: NodeFactory, out_of_vocab_drafter: Callable[[int], Drafter]
) -> None:
    sampling = spb.SamplingParams(max_tokens=6, ignore_eos=True)
    good = spb.GenerateRequest(
        request_id="good", token_ids=spb.TokenIds(ids=[31, 32, 33, 31, 32]), sampling=sampling
    )
    bad = spb.GenerateRequest(
        request_id="bad", token_ids=spb.TokenIds(ids=[21, 22, 23, 21, 22]), sampling=sampling
    )

    async def scenario() -> tuple[spb.GenerateResponse, grpc.aio.AioRpcError]:
        async with in_process_node(drafter=out_of_vocab_drafter(21)) as node:
            results = await asyncio.gather(
                node.stub.Generate(good, timeout=CALL_TIMEOUT_S),
                node.stub.Generate(bad, timeout=CALL_TIMEOUT_S),
                return_exceptions=True,
            )
            stats = await node.wait_until_idle()
            assert stats.running == 0
        answer, failure = results
        assert isinstance(answer, spb.GenerateResponse), answer
        assert isinstance(failure, grpc.aio.AioRpcError), failure
        return answer, failure

    answer, failure = asyncio.run(scenario())
    assert answer.finish_reason == spb.FINISH_REASON_LENGTH
    assert len(answer.token_ids) == 6
    assert failure.code() is grpc.StatusCode.INTERNAL
    assert "IndexError" in (failure.details() or "")
