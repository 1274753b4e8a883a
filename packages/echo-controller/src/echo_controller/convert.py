"""The controller's side of the budget protocol (echo_proto.budget.v1): wire <-> controller values.

Incoming messages are validated here: a bad field raises :class:`FieldError` naming its path
(``utility.budget_step``) and the reason, which the service sends as INVALID_ARGUMENT. The node's
side of the same protocol (its requests, the leases it receives) is in ``echo_server.grpc.convert``;
the constants both sides agree on are defined here. Warm-up records are decoded by the optional
calibration pool (:meth:`.calibration_pool.CalibrationPool.decode`): that needs echo-gating.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import TYPE_CHECKING

from google.protobuf.timestamp_pb2 import Timestamp

from echo_controller.errors import FieldError
from echo_controller.lease_table import LeaseGrant, NodeSpec
from echo_proto.budget.v1 import budget_pb2 as bpb

if TYPE_CHECKING:
    from echo_gating.policy import GatePolicy

WARMUP_FORMAT = "echo-gating/warmup-v1"
"""``ReportRequest.warmup_format`` of the records a node ships (echo-gating's record file)."""
NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}")
MAX_K = 1 << 16  # no verify pass holds more draft tokens than this
MAX_CURVE_TOKENS = 1 << 16
CURVE_TOLERANCE = 1e-9  # increases this small (float rounding) are accepted and flattened


def node_spec(msg: bpb.RegisterNodeRequest) -> NodeSpec:
    node_id(msg.node_id)
    if msg.k_max > MAX_K:
        raise FieldError("k_max", f"must be <= {MAX_K}, got {msg.k_max}")
    points = [(p.total_tokens, p.latency_ms) for p in msg.verify_cost]
    if len(points) == 1:
        raise FieldError("verify_cost", "needs at least two points when given")
    for i, (tokens, ms) in enumerate(points):
        if tokens < 1 or not (math.isfinite(ms) and ms > 0):
            raise FieldError(f"verify_cost[{i}]", f"needs total_tokens >= 1, latency_ms > 0: {ms}")
        if i and tokens <= points[i - 1][0]:
            raise FieldError(f"verify_cost[{i}]", "total_tokens must ascend strictly")
    if len(msg.pool) > 128:
        raise FieldError("pool", "at most 128 characters")
    return NodeSpec(msg.node_id, msg.pool, msg.k_max, msg.models.target, msg.models.drafter)


def node_id(value: str, field: str = "node_id") -> str:
    if not NODE_ID.fullmatch(value):
        raise FieldError(field, f"must match {NODE_ID.pattern}, got {value[:64]!r}")
    return value


def utility_curve(msg: bpb.MarginalUtility) -> list[float]:
    """Per-token marginal utility: each point repeated ``budget_step`` times."""
    values = [float(v) for v in msg.accepted_per_token]
    if not values:
        return []
    step = msg.budget_step
    if step < 1 or step * len(values) > MAX_CURVE_TOKENS:
        raise FieldError(
            "utility.budget_step", f"needs 1 <= step and step * points <= {MAX_CURVE_TOKENS}"
        )
    if not all(math.isfinite(v) and 0 <= v <= 1 for v in values):
        raise FieldError("utility.accepted_per_token", "values must lie in [0, 1]")
    if any(b > a + CURVE_TOLERANCE for a, b in itertools.pairwise(values)):
        raise FieldError("utility.accepted_per_token", "must be non-increasing")
    monotone = itertools.accumulate(values, min)  # flattens the tolerated increases
    return [v for v in monotone for _ in range(step)]


def lease_message(grant: LeaseGrant, gate_version: str, issued_at_s: float) -> bpb.Lease:
    stamp = Timestamp()
    stamp.FromNanoseconds(int(issued_at_s * 1e9))
    return bpb.Lease(
        node_id=grant.node_id,
        budget_k=grant.budget_k,
        gate_policy_version=gate_version,
        ttl_ms=grant.ttl_ms,
        epoch=grant.epoch,
        issued_at=stamp,
    )


def gate_artifact(policy: GatePolicy) -> bpb.GatePolicyArtifact:
    return bpb.GatePolicyArtifact(version=policy.version, json=policy.to_json())
