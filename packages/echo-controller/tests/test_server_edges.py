"""The shared server's edges: malformed and oversized messages, auth before method lookup,
the guarded metrics endpoint, the health-only port, the restart quarantine."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]  # no stubs
from prometheus_client import CollectorRegistry, Counter
from structlog.testing import capture_logs

from echo_controller import process
from echo_controller.lease_table import LeaseConfig
from echo_controller.message_guard import RateLimitedLog
from echo_controller.metrics_http import serve_metrics, split_address
from echo_controller.process import ControllerConfig
from echo_controller.security import auth_metadata
from echo_controller.server import ServerConfig
from echo_proto.budget.v1 import budget_pb2 as bpb

from .conftest import start_controller

CONFIG = LeaseConfig(global_budget=8, ttl_ms=600, slack_ms=100, report_interval_ms=100)
T = 10.0
REGISTER = "/echo_proto.budget.v1.BudgetController/RegisterNode"
MAX = 64 * 1024


def _refused(ctl_metrics: CollectorRegistry, code: str) -> float:
    value = ctl_metrics.get_sample_value("echo_controller_calls_refused_total", {"code": code})
    return value or 0.0


async def _raw_call(
    channel: grpc.aio.Channel, method: str, payload: bytes, token: str | None = None
) -> tuple[grpc.StatusCode, str]:
    # bytes in, bytes out: no client-side validation
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)
    try:
        await call(payload, metadata=auth_metadata(token), timeout=T)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def test_malformed_and_oversized_messages_get_short_statuses_and_are_counted() -> None:
    bad_utf8 = b"\x0a\x02\xff\xfe"  # field 1 (node_id, a string): two bytes, not UTF-8
    corrupt = b"\xff\xff\xff"  # not a protobuf message at all
    huge = bpb.RegisterNodeRequest(node_id="a", pool="p" * (MAX + 10)).SerializeToString()

    async def scenario() -> None:
        running = await process.start_controller(
            ControllerConfig(ServerConfig("127.0.0.1:0", max_message_bytes=MAX), CONFIG, None),
            incarnation=1,
            quarantine=False,
        )
        registry = running.metrics.registry
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.server.port}") as ch:
                with capture_logs() as logs:
                    codes = [await _raw_call(ch, REGISTER, p) for p in (bad_utf8, corrupt, huge)]
                    for _ in range(5):  # a flood logs one line, not five
                        await _raw_call(ch, REGISTER, corrupt)
                ok = await _raw_call(
                    ch, REGISTER, bpb.RegisterNodeRequest(node_id="a").SerializeToString()
                )
        finally:
            await running.stop(None)
        assert (
            codes[0] == codes[1] == (grpc.StatusCode.INVALID_ARGUMENT, "malformed request message")
        )
        assert codes[2][0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "exceeds the limit" in codes[2][1]
        assert ok == (grpc.StatusCode.OK, "")
        assert _refused(registry, "INVALID_ARGUMENT") == 7
        assert _refused(registry, "RESOURCE_EXHAUSTED") == 1
        refusals = [e for e in logs if e["event"] == "request_refused"]
        assert [(e["code"], e["suppressed"]) for e in refusals] == [
            ("INVALID_ARGUMENT", 0),
            ("RESOURCE_EXHAUSTED", 0),
        ]
        assert all("Traceback" not in str(e) for e in logs)

    asyncio.run(scenario())


def test_the_refusal_log_writes_one_line_per_interval_and_counts_the_rest() -> None:
    now = [0.0]
    limited = RateLimitedLog(interval_s=10.0, clock=lambda: now[0])
    with capture_logs() as logs:
        written = []
        for t in (0.0, 1.0, 9.9, 10.0, 10.5, 25.0):
            now[0] = t
            written.append(limited.warning("INVALID_ARGUMENT", "request_refused"))
        limited.warning("UNAUTHENTICATED", "request_refused")
    assert written == [True, False, False, True, False, True]
    assert [e["suppressed"] for e in logs] == [0, 2, 1, 0]


def test_without_a_token_an_unknown_method_is_unauthenticated_not_unimplemented() -> None:
    async def scenario() -> None:
        ctl = await start_controller(CONFIG, token="tok")
        try:
            ch = ctl.channel
            unknown = "/echo_proto.budget.v1.BudgetController/ListSecrets"
            assert (await _raw_call(ch, unknown, b""))[0] == grpc.StatusCode.UNAUTHENTICATED
            nope = await _raw_call(ch, "/no.such.Service/Method", b"\xff")
            assert nope[0] == grpc.StatusCode.UNAUTHENTICATED
            with_token = await _raw_call(ch, unknown, b"", token="tok")
            assert with_token[0] == grpc.StatusCode.UNIMPLEMENTED
            assert _refused(ctl.running.metrics.registry, "UNAUTHENTICATED") == 2
        finally:
            await ctl.stop()

    asyncio.run(scenario())


def _get(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=T) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the response's socket
        return exc.code


def test_the_metrics_endpoint_binds_loopback_and_can_require_the_token() -> None:
    registry = CollectorRegistry()
    Counter("echo_test", "a sample", registry=registry).inc()
    assert split_address(":0") == ("127.0.0.1", 0)
    guarded = serve_metrics(registry, ":0", auth="server", token="tok")
    open_ = serve_metrics(registry, "127.0.0.1:0", token="tok")  # auto on loopback: open
    try:
        assert guarded.server_address[0] == "127.0.0.1"
        url = f"http://127.0.0.1:{guarded.server_port}/metrics"
        assert _get(url) == 401
        assert _get(url, "wrong") == 401
        assert _get(url, "tok") == 200
        assert _get(f"http://127.0.0.1:{open_.server_port}/metrics") == 200
    finally:
        guarded.shutdown()
        open_.shutdown()


def test_the_health_only_port_answers_probes_and_serves_nothing_else() -> None:
    async def scenario() -> None:
        server = ServerConfig("127.0.0.1:0", token="tok", health_listen="127.0.0.1:0")
        running = await process.start_controller(
            ControllerConfig(server, CONFIG, None), incarnation=1, quarantine=False
        )
        try:
            assert running.server.health_port > 0
            target = f"127.0.0.1:{running.server.health_port}"
            async with grpc.aio.insecure_channel(target) as ch:
                reply = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=T
                )
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
                register = bpb.RegisterNodeRequest(node_id="a").SerializeToString()
                code = await _raw_call(ch, REGISTER, register, token="tok")
                assert code[0] == grpc.StatusCode.UNIMPLEMENTED
        finally:
            await running.stop(None)

    asyncio.run(scenario())


def test_a_restarted_controller_grants_nothing_until_old_leases_have_lapsed() -> None:
    async def scenario() -> None:
        ctl = await start_controller(CONFIG, quarantine=True)
        try:
            first = await ctl.stub.RegisterNode(
                bpb.RegisterNodeRequest(node_id="a", k_max=8), timeout=T
            )
            assert first.lease.budget_k == 0  # a predecessor's leases may still be in use
            table = ctl.service.table
            report = bpb.ReportRequest(node_id="a", registration_epoch=first.registration_epoch)
            budgets: list[int] = []
            while not budgets or budgets[-1] == 0:  # a live node, reporting
                await ctl.stub.Report(report, timeout=T)
                current = table.current("a")
                assert current is not None
                budgets.append(current.budget_k)
                await asyncio.sleep(0.05)
            assert table.quarantine_until is None
            assert set(budgets[:-1]) == {0}
            assert budgets[-1] == 8
        finally:
            await ctl.stop()

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
