"""The controller's side of the budget protocol: validation names the field."""

from __future__ import annotations

import pytest

from echo_controller import convert
from echo_controller.errors import FieldError
from echo_controller.lease_table import LeaseGrant, NodeSpec
from echo_proto.budget.v1 import budget_pb2 as bpb


def test_utility_curves_are_validated_and_expanded_per_token() -> None:
    curve = convert.utility_curve(bpb.MarginalUtility(budget_step=2, accepted_per_token=[0.5, 0.2]))

    assert curve == [0.5, 0.5, 0.2, 0.2]
    assert convert.utility_curve(bpb.MarginalUtility()) == []
    for bad, field in [
        (bpb.MarginalUtility(budget_step=1, accepted_per_token=[0.2, 0.5]), "accepted_per_token"),
        (bpb.MarginalUtility(budget_step=1, accepted_per_token=[1.5]), "accepted_per_token"),
        (bpb.MarginalUtility(budget_step=0, accepted_per_token=[0.5]), "budget_step"),
        (bpb.MarginalUtility(budget_step=1 << 16, accepted_per_token=[0.5, 0.4]), "budget_step"),
    ]:
        with pytest.raises(FieldError, match=field):
            convert.utility_curve(bad)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (bpb.RegisterNodeRequest(node_id=""), "node_id"),
        (bpb.RegisterNodeRequest(node_id="bad id"), "node_id"),
        (bpb.RegisterNodeRequest(node_id="n", k_max=1 << 20), "k_max"),
        (
            bpb.RegisterNodeRequest(
                node_id="n", verify_cost=[bpb.VerifyCostPoint(total_tokens=4, latency_ms=1)]
            ),
            "verify_cost",
        ),
        (
            bpb.RegisterNodeRequest(
                node_id="n",
                verify_cost=[
                    bpb.VerifyCostPoint(total_tokens=4, latency_ms=1),
                    bpb.VerifyCostPoint(total_tokens=2, latency_ms=1),
                ],
            ),
            "verify_cost[1]",
        ),
    ],
)
def test_bad_registrations_name_the_field(request_: bpb.RegisterNodeRequest, field: str) -> None:
    with pytest.raises(FieldError) as info:
        convert.node_spec(request_)

    assert info.value.field == field


def test_a_registration_maps_to_the_tables_node_spec() -> None:
    request = bpb.RegisterNodeRequest(
        node_id="host/127.0.0.1:7001",
        pool="dp",
        k_max=16,
        models=bpb.ModelPair(target="t", drafter="d"),
    )

    assert convert.node_spec(request) == NodeSpec("host/127.0.0.1:7001", "dp", 16, "t", "d")


def test_a_lease_carries_the_grant_and_its_issue_time() -> None:
    message = convert.lease_message(LeaseGrant("n0", 6, 42, 3000), "v1", 1_700_000_000.5)

    assert (message.node_id, message.budget_k, message.epoch, message.ttl_ms) == ("n0", 6, 42, 3000)
    assert message.gate_policy_version == "v1"
    assert message.issued_at.seconds == 1_700_000_000
    assert message.issued_at.nanos == 500_000_000
