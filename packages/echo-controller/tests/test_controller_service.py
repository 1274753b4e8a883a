"""The budget controller in process: registration, reports, lease streams, refusals.

Calibration sharing (it needs echo-gating) is tested in test_calibration_pool.py."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from echo_controller import convert
from echo_controller.lease_table import LeaseConfig
from echo_controller.security import auth_metadata
from echo_proto.budget.v1 import budget_pb2 as bpb

from .conftest import eventually, start_controller

CONFIG = LeaseConfig(global_budget=10, ttl_ms=600, slack_ms=100, report_interval_ms=100)
T = 10.0  # call timeout


def _register(node_id: str, k_max: int = 8) -> bpb.RegisterNodeRequest:
    return bpb.RegisterNodeRequest(
        node_id=node_id, pool="dp", k_max=k_max, models=bpb.ModelPair(target="t", drafter="d")
    )


async def _code(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_registration_reports_and_watch_streams_follow_the_split() -> None:
    async def scenario() -> None:
        ctl = await start_controller(CONFIG)
        try:
            first = await ctl.stub.RegisterNode(_register("a"), timeout=T)
            assert (first.lease.budget_k, first.report_interval_ms) == (8, 100)
            watch = ctl.stub.WatchPolicy(
                bpb.WatchPolicyRequest(node_id="a", registration_epoch=first.registration_epoch)
            )
            current = await watch.read()
            assert isinstance(current, bpb.WatchPolicyResponse)
            assert current.lease.epoch == first.lease.epoch
            await ctl.stub.RegisterNode(_register("b"), timeout=T)
            shrink = await watch.read()  # b's arrival: a is told to shrink to 5
            assert isinstance(shrink, bpb.WatchPolicyResponse)
            assert shrink.lease.budget_k == 5
            assert shrink.lease.epoch > first.lease.epoch
            watch.cancel()
            committed = ctl.service.table.pool_committed(time.monotonic())
            assert committed == {"dp": 10}
        finally:
            await ctl.stop()

    asyncio.run(scenario())


def test_unknown_stale_and_malformed_calls_are_refused_with_their_codes() -> None:
    async def scenario() -> dict[str, grpc.StatusCode]:
        ctl = await start_controller(CONFIG)
        try:
            old = await ctl.stub.RegisterNode(_register("a"), timeout=T)
            new = await ctl.stub.RegisterNode(_register("a"), timeout=T)
            report = bpb.ReportRequest(node_id="a", registration_epoch=new.registration_epoch)
            bad_curve = bpb.ReportRequest()
            bad_curve.CopyFrom(report)
            bad_curve.utility.budget_step = 1
            bad_curve.utility.accepted_per_token.extend([0.1, 0.9])
            stale = bpb.ReportRequest(node_id="a", registration_epoch=old.registration_epoch)
            return {
                "ok": await _code(ctl.stub.Report(report, timeout=T)),
                "unknown": await _code(
                    ctl.stub.Report(bpb.ReportRequest(node_id="ghost"), timeout=T)
                ),
                "stale": await _code(ctl.stub.Report(stale, timeout=T)),
                "curve": await _code(ctl.stub.Report(bad_curve, timeout=T)),
                "node_id": await _code(ctl.stub.RegisterNode(_register("no spaces"), timeout=T)),
                "watch_stale": await _code(
                    _first(
                        ctl.stub.WatchPolicy(
                            bpb.WatchPolicyRequest(
                                node_id="a", registration_epoch=old.registration_epoch
                            ),
                            timeout=T,
                        )
                    )
                ),
            }
        finally:
            await ctl.stop()

    codes = asyncio.run(scenario())
    assert codes == {
        "ok": grpc.StatusCode.OK,
        "unknown": grpc.StatusCode.NOT_FOUND,
        "stale": grpc.StatusCode.FAILED_PRECONDITION,
        "curve": grpc.StatusCode.INVALID_ARGUMENT,
        "node_id": grpc.StatusCode.INVALID_ARGUMENT,
        "watch_stale": grpc.StatusCode.FAILED_PRECONDITION,
    }


async def _first(
    stream: grpc.aio.UnaryStreamCall[bpb.WatchPolicyRequest, bpb.WatchPolicyResponse],
) -> None:
    async for _ in stream:
        return


def test_a_silent_node_is_dropped_after_its_ttl_and_its_budget_shared() -> None:
    async def scenario() -> None:
        ctl = await start_controller(CONFIG)
        try:
            a = await ctl.stub.RegisterNode(_register("a"), timeout=T)
            await ctl.stub.RegisterNode(_register("b"), timeout=T)  # b never reports again
            table = ctl.service.table

            async def keep_a_alive() -> None:
                epoch = a.lease.epoch
                while True:
                    await ctl.stub.Report(
                        bpb.ReportRequest(
                            node_id="a", registration_epoch=a.registration_epoch, lease_epoch=epoch
                        ),
                        timeout=T,
                    )
                    current = table.current("a")
                    epoch = current.epoch if current is not None else epoch
                    await asyncio.sleep(0.05)

            reporter = asyncio.create_task(keep_a_alive())
            await eventually(lambda: "b" not in table.committed(time.monotonic()))
            await eventually(lambda: table.committed(time.monotonic()) == {"a": 8})
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
        finally:
            await ctl.stop()

    asyncio.run(scenario())


def test_without_calibration_records_and_drift_are_ignored() -> None:
    async def scenario() -> tuple[grpc.StatusCode, bpb.WatchPolicyResponse]:
        ctl = await start_controller(CONFIG)  # no calibration pool
        try:
            reg = await ctl.stub.RegisterNode(_register("a"), timeout=T)
            watch = ctl.stub.WatchPolicy(
                bpb.WatchPolicyRequest(node_id="a", registration_epoch=reg.registration_epoch)
            )
            first = await watch.read()
            assert isinstance(first, bpb.WatchPolicyResponse)
            report = bpb.ReportRequest(
                node_id="a",
                registration_epoch=reg.registration_epoch,
                lease_epoch=first.lease.epoch,
                warmup_records=b"not decoded without a pool",
                warmup_format=convert.WARMUP_FORMAT,
                drift_detected=True,
                drift_reason="depth 2: realised acceptance 0.4 vs predicted 0.7",
            )
            code = await _code(ctl.stub.Report(report, timeout=T))
            watch.cancel()
            return code, first
        finally:
            await ctl.stop()

    code, first = asyncio.run(scenario())
    assert code == grpc.StatusCode.OK
    assert first.lease.gate_policy_version == ""
    assert not first.HasField("gate_policy")


def test_the_controller_refuses_calls_without_its_token() -> None:
    async def scenario() -> tuple[grpc.StatusCode, grpc.StatusCode]:
        ctl = await start_controller(CONFIG, token="tok")
        try:
            denied = await _code(ctl.stub.RegisterNode(_register("a"), timeout=T))
            allowed = await _code(
                ctl.stub.RegisterNode(_register("a"), metadata=auth_metadata("tok"), timeout=T)
            )
            return denied, allowed
        finally:
            await ctl.stop()

    assert asyncio.run(scenario()) == (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.OK)


@pytest.mark.parametrize("budget", [0, 3])
def test_leases_never_exceed_the_budget_or_k_max(budget: int) -> None:
    async def scenario() -> list[int]:
        ctl = await start_controller(
            LeaseConfig(global_budget=budget, ttl_ms=600, slack_ms=100, report_interval_ms=100)
        )
        try:
            replies = [await ctl.stub.RegisterNode(_register(n, 2), timeout=T) for n in "abc"]
            return [r.lease.budget_k for r in replies]
        finally:
            await ctl.stop()

    leases = asyncio.run(scenario())
    assert sum(leases) <= budget
    assert max(leases) <= 2
