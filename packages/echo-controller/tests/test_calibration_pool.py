"""Calibration sharing on the controller: pooling, renumbering, recalibration gates, and the
service pushing a recalibrated policy. Needs echo-gating (conftest skips this file without it)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from echo_controller import convert
from echo_controller.calibration import PoolConfig, calibration_pool
from echo_controller.calibration_pool import CalibrationPool
from echo_controller.errors import CalibrationFailedError, FieldError
from echo_controller.lease_table import LeaseConfig
from echo_gating.policy import GatePolicy
from echo_gating.record_file import encode_records
from echo_gating.testing import SyntheticSpec, synthetic_records
from echo_proto.budget.v1 import budget_pb2 as bpb

from .conftest import start_controller

PAIR = ("target.gguf", "ngram")


def test_records_of_two_nodes_never_share_a_request_id() -> None:
    pool = CalibrationPool(PoolConfig(min_records=1, min_interval_s=0.0))
    gen = torch.Generator().manual_seed(0)
    a = synthetic_records(SyntheticSpec(), gen, num_requests=3, steps=2)
    b = synthetic_records(SyntheticSpec(), gen, num_requests=3, steps=2)
    pool.add(PAIR, a)
    pool.add(PAIR, b)

    records = pool.claim(PAIR, now=0.0)

    assert records is not None
    assert torch.unique(records.request_id).numel() == 6
    assert dict(records.meta) == {"target": PAIR[0], "drafter": PAIR[1]}


def test_recalibration_waits_for_enough_records_and_the_interval() -> None:
    pool = CalibrationPool(PoolConfig(max_records=50_000, min_records=5_000, min_interval_s=30.0))
    gen = torch.Generator().manual_seed(1)
    pool.add(PAIR, synthetic_records(SyntheticSpec(), gen, num_requests=10, steps=10))
    assert pool.claim(PAIR, now=0.0) is None  # 800 records < 5000

    pool.add(PAIR, synthetic_records(SyntheticSpec(), gen, num_requests=100, steps=10))
    records = pool.claim(PAIR, now=0.0)
    assert records is not None
    assert pool.claim(PAIR, now=0.0) is None  # busy until installed

    policy = pool.recalibrate(records)
    pool.install(PAIR, policy, now=0.0)
    assert pool.policy(PAIR) == policy
    assert policy.checkpoints
    assert pool.claim(PAIR, now=10.0) is None  # too soon
    assert pool.claim(PAIR, now=31.0) is not None


def test_the_pool_keeps_only_the_newest_records() -> None:
    pool = CalibrationPool(PoolConfig(max_records=1_000, min_records=1))
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        pool.add(PAIR, synthetic_records(SyntheticSpec(), gen, num_requests=5, steps=10))  # 400

    assert 1_000 <= pool.records(PAIR) < 1_400


def test_the_loader_builds_a_pool_when_echo_gating_is_installed() -> None:
    pool = calibration_pool(PoolConfig(min_records=7))

    assert isinstance(pool, CalibrationPool)
    assert pool.config.min_records == 7


def test_warmup_records_are_decoded_and_bad_ones_name_the_field() -> None:
    records = synthetic_records(SyntheticSpec(), torch.Generator().manual_seed(0), 2, 3)
    message = bpb.ReportRequest(
        warmup_records=encode_records(records), warmup_format=convert.WARMUP_FORMAT
    )

    decoded = CalibrationPool.decode(bpb.ReportRequest.FromString(message.SerializeToString()))

    assert decoded is not None
    assert torch.equal(decoded.accepted, records.accepted)
    assert CalibrationPool.decode(bpb.ReportRequest()) is None
    with pytest.raises(FieldError, match="warmup_format"):
        CalibrationPool.decode(bpb.ReportRequest(warmup_records=b"x", warmup_format="pickle"))
    with pytest.raises(FieldError, match="warmup_records"):
        CalibrationPool.decode(
            bpb.ReportRequest(warmup_records=b"garbage", warmup_format=convert.WARMUP_FORMAT)
        )


def test_a_refused_recalibration_is_a_calibration_failure() -> None:
    pool = CalibrationPool(PoolConfig(min_records=1))
    records = synthetic_records(SyntheticSpec(), torch.Generator().manual_seed(3), 2, 2)
    empty = records.select(torch.zeros(len(records), dtype=torch.bool))

    with pytest.raises(CalibrationFailedError, match="zero records"):
        pool.recalibrate(empty)


CONFIG = LeaseConfig(global_budget=10, ttl_ms=600, slack_ms=100, report_interval_ms=100)
T = 10.0  # call timeout


def test_drift_reports_trigger_a_recalibration_pushed_with_the_next_lease() -> None:
    records = synthetic_records(SyntheticSpec(), torch.Generator().manual_seed(0), 200, 10)

    async def scenario() -> bpb.WatchPolicyResponse:
        pool = PoolConfig(min_records=1000, min_interval_s=0.0)
        ctl = await start_controller(CONFIG, calibration=pool)
        try:
            register = bpb.RegisterNodeRequest(
                node_id="a", pool="dp", k_max=8, models=bpb.ModelPair(target="t", drafter="d")
            )
            reg = await ctl.stub.RegisterNode(register, timeout=T)
            watch = ctl.stub.WatchPolicy(
                bpb.WatchPolicyRequest(node_id="a", registration_epoch=reg.registration_epoch)
            )
            report = bpb.ReportRequest(
                node_id="a",
                registration_epoch=reg.registration_epoch,
                warmup_records=encode_records(records),
                warmup_format=convert.WARMUP_FORMAT,
                drift_detected=True,
                drift_reason="depth 2: realised acceptance 0.4 vs predicted 0.7",
            )
            await ctl.stub.Report(report, timeout=T)
            plain = bpb.ReportRequest(node_id="a", registration_epoch=reg.registration_epoch)
            while True:
                message = await watch.read()
                assert isinstance(message, bpb.WatchPolicyResponse)
                if message.lease.gate_policy_version:
                    watch.cancel()
                    return message
                await ctl.stub.Report(plain, timeout=T)  # renewals until the policy is ready
        finally:
            await ctl.stop()

    message = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    policy = GatePolicy.from_json(message.gate_policy.json)
    assert policy.version == message.gate_policy.version == message.lease.gate_policy_version
    assert policy.checkpoints  # calibrated from the pooled records
    assert dict(policy.calibrated_for) == {"drafter": "d", "target": "t"}
