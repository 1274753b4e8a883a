"""A controller process with TLS, mTLS and a bearer token refuses every incomplete client."""

from __future__ import annotations

import ssl
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]  # no stubs

from echo_proto.budget.v1 import budget_pb2 as bpb
from echo_proto.budget.v1 import budget_pb2_grpc

from .conftest import TOKEN, Certs, Proc, launch, open_channel

AUTH = (("authorization", f"Bearer {TOKEN}"),)
T = 10.0


@pytest.fixture(scope="module")
def controller(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    work: Path = tmp_path_factory.mktemp("controller")
    args = [
        "controller",
        "--listen", "127.0.0.1:0",
        "--global-budget", "8",
        "--tls-cert", str(certs.server_cert),
        "--tls-key", str(certs.server_key),
        "--tls-client-ca", str(certs.ca),
        "--token-file", str(certs.token_file),
        "--metrics-listen", "127.0.0.1:0",
        "--metrics-auth", "server",
        "--health-listen", "127.0.0.1:0",
    ]  # fmt: skip
    proc = launch("controller", args, work, certs.channel_credentials())
    yield proc
    proc.stop()


def _register(
    controller: Proc,
    credentials: grpc.ChannelCredentials | None,
    metadata: tuple[tuple[str, str], ...] = (),
    node_id: str = "n0",
) -> grpc.StatusCode:
    with open_channel(controller.target, credentials) as channel:
        stub = budget_pb2_grpc.BudgetControllerStub(channel)
        try:
            stub.RegisterNode(
                bpb.RegisterNodeRequest(node_id=node_id, k_max=4), metadata=metadata, timeout=T
            )
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_clients_without_certificate_or_token_are_refused(controller: Proc, certs: Certs) -> None:
    assert _register(controller, None, AUTH) == grpc.StatusCode.UNAVAILABLE  # plaintext
    no_client_cert = certs.channel_credentials(client_cert=False)
    assert _register(controller, no_client_cert, AUTH) == grpc.StatusCode.UNAVAILABLE  # mTLS
    full = certs.channel_credentials()
    assert _register(controller, full) == grpc.StatusCode.UNAUTHENTICATED
    wrong = (("authorization", "Bearer nope"),)
    assert _register(controller, full, wrong) == grpc.StatusCode.UNAUTHENTICATED
    assert _register(controller, full, AUTH) == grpc.StatusCode.OK
    metrics = controller.metrics(certs.ssl_context(), TOKEN)
    assert metrics['echo_controller_calls_refused_total{code="UNAUTHENTICATED"}'] >= 2


def test_metrics_need_the_servers_tls_client_certificate_and_token(
    controller: Proc, certs: Certs
) -> None:
    # Plain HTTP, then TLS without a client certificate. Under TLS 1.3 the server's
    # "certificate required" alert can arrive after the handshake, as an ssl.SSLError on the
    # first read of the response: that is the same refusal.
    for context in (None, certs.ssl_context(client_cert=False)):
        with pytest.raises((ConnectionError, urllib.error.URLError, ssl.SSLError)) as refused:
            controller.metrics(context, TOKEN)
        assert not isinstance(refused.value, urllib.error.HTTPError)  # refused before HTTP
    with pytest.raises(urllib.error.HTTPError) as no_token:
        controller.metrics(certs.ssl_context())
    assert no_token.value.code == 401
    no_token.value.close()  # it holds the response's socket
    assert "echo_controller_nodes" in controller.metrics(certs.ssl_context(), TOKEN)


def test_probes_without_a_client_certificate_use_the_health_only_port(
    controller: Proc, certs: Certs
) -> None:
    assert controller.health_port > 0
    with open_channel(f"127.0.0.1:{controller.health_port}", None) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=T
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as other:
            budget_pb2_grpc.BudgetControllerStub(channel).RegisterNode(
                bpb.RegisterNodeRequest(node_id="probe"), metadata=AUTH, timeout=T
            )
    assert other.value.code() == grpc.StatusCode.UNIMPLEMENTED  # health only


def test_without_a_token_unknown_methods_are_unauthenticated(
    controller: Proc, certs: Certs
) -> None:
    secret = "/echo_proto.budget.v1.BudgetController/Secret"
    with open_channel(controller.target, certs.channel_credentials()) as channel:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(secret)
        with pytest.raises(grpc.RpcError) as info:
            call(b"", timeout=T)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_health_needs_no_token_but_still_the_certificate(controller: Proc, certs: Certs) -> None:
    with open_channel(controller.target, certs.channel_credentials()) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=T
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_unknown_stale_and_oversized_calls_get_their_codes(controller: Proc, certs: Certs) -> None:
    with open_channel(controller.target, certs.channel_credentials()) as channel:
        stub = budget_pb2_grpc.BudgetControllerStub(channel)
        old = stub.RegisterNode(bpb.RegisterNodeRequest(node_id="n1"), metadata=AUTH, timeout=T)
        stub.RegisterNode(bpb.RegisterNodeRequest(node_id="n1"), metadata=AUTH, timeout=T)
        calls = {
            "unknown": bpb.ReportRequest(node_id="ghost"),
            "stale": bpb.ReportRequest(node_id="n1", registration_epoch=old.registration_epoch),
            "oversized": bpb.ReportRequest(node_id="n1", warmup_records=b"\0" * (5 << 20)),
        }
        codes = {}
        for name, request in calls.items():
            with pytest.raises(grpc.RpcError) as info:
                stub.Report(request, metadata=AUTH, timeout=T)
            codes[name] = info.value.code()
    assert codes == {
        "unknown": grpc.StatusCode.NOT_FOUND,
        "stale": grpc.StatusCode.FAILED_PRECONDITION,
        "oversized": grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
