"""The generated messages serialize, and the typed gRPC stubs serve and call over loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from echo_proto.budget.v1 import budget_pb2
from echo_proto.serving.v1 import serving_pb2, serving_pb2_grpc

CALL_TIMEOUT_S = 10.0


def test_generate_request_round_trips_with_token_prompt_and_seed() -> None:
    request = serving_pb2.GenerateRequest(
        request_id="r-1",
        token_ids=serving_pb2.TokenIds(ids=[1, 2, 50_000]),
        sampling=serving_pb2.SamplingParams(
            temperature=0.7, top_k=40, top_p=0.9, seed=0, max_tokens=64, stop=["\n\n"]
        ),
        policy="echo",
    )

    decoded = serving_pb2.GenerateRequest.FromString(request.SerializeToString())

    assert decoded == request
    assert decoded.WhichOneof("prompt") == "token_ids"
    assert list(decoded.token_ids.ids) == [1, 2, 50_000]
    # seed=0 and policy are `optional`: set-to-default stays distinguishable from unset.
    assert decoded.sampling.HasField("seed")
    assert decoded.HasField("policy")
    assert not serving_pb2.SamplingParams().HasField("seed")


def test_stream_final_message_round_trips_with_stats() -> None:
    final = serving_pb2.GenerateStreamResponse(
        final=serving_pb2.GenerateStreamFinal(
            request_id="r-2",
            finish_reason=serving_pb2.FINISH_REASON_STOP_STRING,
            stats=serving_pb2.RequestStats(output_tokens=12, mean_accepted_length=3.0),
        )
    )

    decoded = serving_pb2.GenerateStreamResponse.FromString(final.SerializeToString())

    assert decoded.WhichOneof("event") == "final"
    assert decoded.final.finish_reason == serving_pb2.FINISH_REASON_STOP_STRING
    assert decoded.final.stats.mean_accepted_length == 3.0


def test_report_and_lease_round_trip() -> None:
    report = budget_pb2.ReportRequest(
        node_id="host-0/dp-0",
        load=budget_pb2.Load(running=8, waiting=2),
        utility=budget_pb2.MarginalUtility(budget_step=16, accepted_per_token=[0.8, 0.5, 0.1]),
        warmup_records=b"\x00\x01",
        warmup_format="echo-gating/warmup-v1",
    )
    lease = budget_pb2.WatchPolicyResponse(
        lease=budget_pb2.Lease(
            node_id="host-0/dp-0",
            budget_k=48,
            ttl_ms=5_000,
            epoch=2**40,
            issued_at=Timestamp(seconds=1_700_000_000),
        )
    )

    assert budget_pb2.ReportRequest.FromString(report.SerializeToString()) == report
    decoded = budget_pb2.WatchPolicyResponse.FromString(lease.SerializeToString())
    assert decoded.lease.epoch == 2**40
    assert decoded.lease.issued_at.seconds == 1_700_000_000


class FakeGenerationService(serving_pb2_grpc.GenerationServiceServicer):
    """Answers with canned values so that only the wire is under test."""

    async def Generate(  # noqa: N802 (gRPC method name)
        self,
        request: serving_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext[
            serving_pb2.GenerateRequest, serving_pb2.GenerateResponse
        ],
    ) -> serving_pb2.GenerateResponse:
        return serving_pb2.GenerateResponse(request_id=request.request_id, text=request.text)

    async def GenerateStream(  # noqa: N802 (gRPC method name)
        self,
        request: serving_pb2.GenerateStreamRequest,
        context: grpc.aio.ServicerContext[
            serving_pb2.GenerateStreamRequest, serving_pb2.GenerateStreamResponse
        ],
    ) -> AsyncIterator[serving_pb2.GenerateStreamResponse]:
        yield serving_pb2.GenerateStreamResponse(
            delta=serving_pb2.TokenDelta(token_ids=[7, 8], text="hi")
        )
        yield serving_pb2.GenerateStreamResponse(
            final=serving_pb2.GenerateStreamFinal(
                request_id=request.request.request_id,
                finish_reason=serving_pb2.FINISH_REASON_EOS,
            )
        )

    async def GetStats(  # noqa: N802 (gRPC method name)
        self,
        request: serving_pb2.GetStatsRequest,
        context: grpc.aio.ServicerContext[
            serving_pb2.GetStatsRequest, serving_pb2.GetStatsResponse
        ],
    ) -> serving_pb2.GetStatsResponse:
        return serving_pb2.GetStatsResponse(node_id="n-0", running=3, waiting=1, budget_k=32)


async def _call_fake_server() -> tuple[serving_pb2.GetStatsResponse, list[str]]:
    server = grpc.aio.server()
    serving_pb2_grpc.add_GenerationServiceServicer_to_server(FakeGenerationService(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = serving_pb2_grpc.GenerationServiceStub(channel)
            stats = await stub.GetStats(serving_pb2.GetStatsRequest(), timeout=CALL_TIMEOUT_S)
            request = serving_pb2.GenerateStreamRequest(
                request=serving_pb2.GenerateRequest(request_id="r-3", text="hello")
            )
            events: list[str] = [
                message.WhichOneof("event") or ""
                async for message in stub.GenerateStream(request, timeout=CALL_TIMEOUT_S)
            ]
    finally:
        await server.stop(grace=None)
    return stats, events


def test_get_stats_and_stream_over_loopback_grpc() -> None:
    stats, events = asyncio.run(_call_fake_server())

    assert (stats.node_id, stats.running, stats.waiting, stats.budget_k) == ("n-0", 3, 1, 32)
    assert events == ["delta", "final"]
