"""Wire <-> core mapping on the node: validation names the field; values survive the round trip
(to the controller's side, echo_controller.convert, and back)."""

from __future__ import annotations

import math

import pytest
import torch

from echo_controller import convert as controller_convert
from echo_controller.calibration_pool import CalibrationPool
from echo_controller.errors import FieldError
from echo_controller.lease_table import LeaseGrant
from echo_gating.policy import GatePolicy
from echo_gating.testing import SyntheticSpec, synthetic_records
from echo_proto.budget.v1 import budget_pb2 as bpb
from echo_proto.serving.v1 import serving_pb2 as spb
from echo_server.engine import FinishReason
from echo_server.grpc import convert
from echo_server.node.items import RequestSummary
from echo_server.node.lease import NodeReport
from echo_server.node.limits import RequestLimits

LIMITS = RequestLimits(vocab_size=100, policy="echo", default_max_tokens=7, max_tokens=64)
S = spb.SamplingParams


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (spb.GenerateRequest(), "prompt"),
        (spb.GenerateRequest(text="  \n"), "text"),
        (spb.GenerateRequest(text="x" * 70_000), "text"),
        (spb.GenerateRequest(token_ids=spb.TokenIds()), "token_ids.ids"),
        (spb.GenerateRequest(token_ids=spb.TokenIds(ids=[1, 100])), "token_ids.ids"),
        (spb.GenerateRequest(token_ids=spb.TokenIds(ids=[1]), chat=True), "chat"),
        (spb.GenerateRequest(text="hi", policy="eagle9"), "policy"),
        (spb.GenerateRequest(text="hi", request_id="a\nb"), "request_id"),
        (spb.GenerateRequest(text="hi", sampling=S(temperature=-1)), "sampling.temperature"),
        (spb.GenerateRequest(text="hi", sampling=S(temperature=math.nan)), "sampling.temperature"),
        (spb.GenerateRequest(text="hi", sampling=S(top_k=-3)), "sampling.top_k"),
        (spb.GenerateRequest(text="hi", sampling=S(top_p=1.5)), "sampling.top_p"),
        (spb.GenerateRequest(text="hi", sampling=S(max_tokens=65)), "sampling.max_tokens"),
        (spb.GenerateRequest(text="hi", sampling=S(stop=[""])), "sampling.stop"),
    ],
)
def test_malformed_requests_name_the_field(request_: spb.GenerateRequest, field: str) -> None:
    with pytest.raises(FieldError) as info:
        convert.generation_request(request_, LIMITS, "assigned")

    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_proto_defaults_keep_their_documented_meaning() -> None:
    request = convert.generation_request(spb.GenerateRequest(text="hi"), LIMITS, "assigned")

    assert request.request_id == "assigned"
    p = request.params
    assert (p.temperature, p.top_k, p.top_p, p.max_tokens, p.seed) == (0.0, 0, 1.0, 7, None)
    seeded = convert.generation_request(
        spb.GenerateRequest(
            request_id="r",
            token_ids=spb.TokenIds(ids=[3, 4]),
            sampling=S(temperature=0.5, seed=0, stop=["\n"], max_tokens=3),
        ),
        LIMITS,
        "unused",
    )
    assert seeded.prompt_ids == (3, 4)
    assert seeded.params.seed == 0
    assert seeded.params.stop == ("\n",)
    assert seeded.request_id == "r"


def test_summary_maps_to_response_and_stream_final() -> None:
    summary = RequestSummary(
        "r", FinishReason.CANCELLED, 5, (1, 2), "ab", 2, 6, 3, 2.5, 0.5, 1.0, 2.0, 3.0
    )

    response = convert.generate_response(summary)
    final = convert.stream_final(summary).final

    assert response.finish_reason == final.finish_reason == spb.FINISH_REASON_ABORTED
    assert list(response.token_ids) == [1, 2]
    assert response.text == "ab"
    assert response.stats == final.stats
    assert (response.stats.output_tokens, response.stats.draft_yield) == (2, 0.5)


def test_report_records_and_gate_policies_survive_the_wire() -> None:
    records = synthetic_records(SyntheticSpec(), torch.Generator().manual_seed(0), 2, 3)
    report = NodeReport(1, 0, (0.5,), 1, 100, 3, 9, 4, 2.3, 7, "none", records, "drifted")

    message = convert.report_request("n0", 5, report)
    decoded = CalibrationPool.decode(bpb.ReportRequest.FromString(message.SerializeToString()))

    assert decoded is not None
    assert torch.equal(decoded.accepted, records.accepted)
    assert message.drift_detected
    assert message.registration_epoch == 5
    policy = GatePolicy.sparse({2: 0.4}, max_depth=4)
    assert message.warmup_format == controller_convert.WARMUP_FORMAT
    assert convert.gate_policy(controller_convert.gate_artifact(policy)) == policy
    with pytest.raises(FieldError, match=r"gate_policy\.version"):
        convert.gate_policy(bpb.GatePolicyArtifact(version="other", json=policy.to_json()))


def test_leases_carry_the_grant_and_arrive_with_the_receipt_time() -> None:
    message = controller_convert.lease_message(LeaseGrant("n0", 6, 42, 3000), "v1", 1_700_000_000.5)
    lease = convert.received_lease(message, now=10.0)

    assert (lease.budget_k, lease.epoch, lease.gate_policy_version) == (6, 42, "v1")
    assert lease.expires_at == 13.0
    assert lease.live(12.9)
    assert not lease.live(13.0)
    assert message.issued_at.seconds == 1_700_000_000


def test_extreme_but_valid_sampling_numbers_stay_computable() -> None:
    """Found by fuzzing: a denormal top_p rounds to 0 in float32 and a denormal temperature
    overflows ``logits / T``; either used to fail the engine step of the whole batch."""
    tiny = convert.sampling_params(S(temperature=1e-40, top_p=5e-324), LIMITS)

    assert tiny.temperature == 0.0
    assert tiny.top_p == convert.MIN_TOP_P > 0
    assert convert.sampling_params(S(temperature=0.7, top_p=0.9), LIMITS).temperature == 0.7
