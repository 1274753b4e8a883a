"""Multi-process fixtures: test certificates, and ``echo-sd`` processes on loopback.

Every process binds port 0 and writes its ports to a ready file; the launcher polls that file
and then the gRPC health check, each with a deadline (never a fixed sleep). Logs go to files
under the test's tmp dir and are printed when a process fails to start.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]  # no stubs

from echo_proto.serving.v1 import serving_pb2 as spb

START_DEADLINE_S = 240.0  # three model loads on two busy cores
TOKEN = "integration-token"


@dataclass(frozen=True)
class Certs:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    token_file: Path

    def ssl_context(self, client_cert: bool = True) -> ssl.SSLContext:
        """An HTTPS client context trusting the test CA (with the client certificate)."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if client_cert:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context

    def channel_credentials(self, client_cert: bool = True) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.read_bytes(),
            private_key=self.client_key.read_bytes() if client_cert else None,
            certificate_chain=self.client_cert.read_bytes() if client_cert else None,
        )


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    server: bool = False,
    client: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    issuer_name, issuer_key = issuer if issuer is not None else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if server:
        san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    if client:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(
    path: Path, cert: x509.Certificate | None, key: ec.EllipticCurvePrivateKey | None
) -> Path:
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return path


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, plus a token file."""
    out = tmp_path_factory.mktemp("certs")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("echo-test-ca", ca_key, None)
    server_key, client_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    server = _issue("127.0.0.1", server_key, (ca.subject, ca_key), server=True)
    client = _issue("echo-node", client_key, (ca.subject, ca_key), client=True)
    token = out / "token"
    token.write_text(TOKEN + "\n")
    return Certs(
        dir=out,
        ca=_write(out / "ca.pem", ca, None),
        server_cert=_write(out / "server.pem", server, None),
        server_key=_write(out / "server.key", None, server_key),
        client_cert=_write(out / "client.pem", client, None),
        client_key=_write(out / "client.key", None, client_key),
        token_file=token,
    )


@dataclass
class Proc:
    """One ``echo-sd`` process with the ports it bound."""

    name: str
    args: list[str]
    log: Path
    ready: Path
    popen: subprocess.Popen[bytes]
    grpc_port: int = 0
    metrics_port: int = 0
    health_port: int = 0

    def wait_ready(self, credentials: grpc.ChannelCredentials | None) -> None:
        """Poll for the ready file, then the health check, within START_DEADLINE_S."""
        deadline = time.monotonic() + START_DEADLINE_S
        while not self.ready.is_file():
            if not self.alive() or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"{self.name} did not start:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.1)
        ports = json.loads(self.ready.read_text())
        self.grpc_port, self.metrics_port = ports["grpc_port"], ports["metrics_port"]
        self.health_port = ports.get("health_port", 0)
        wait_healthy(self.target, credentials, deadline)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, no deregistration."""
        if self.alive():
            self.popen.kill()
        self.popen.wait(timeout=30)

    def stop(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=30)

    def metrics(
        self, context: ssl.SSLContext | None = None, token: str | None = None
    ) -> dict[str, float]:
        """The process's Prometheus samples, ``name{labels}`` -> value (over HTTPS with
        ``context``, with ``token`` as the bearer token)."""
        scheme = "https" if context is not None else "http"
        request = urllib.request.Request(
            f"{scheme}://127.0.0.1:{self.metrics_port}/metrics",
            headers={"Authorization": f"Bearer {token}"} if token else {},
        )
        with urllib.request.urlopen(request, timeout=10, context=context) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out


def budget_sample(
    stubs: list[Any], metadata: tuple[tuple[str, str], ...], timeout: float
) -> int | None:
    """The sum of the nodes' effective K at one instant, or None when it cannot be known.

    Double collect: read every node's (lease epoch, K), then read them all again. A node whose
    pair did not change between its two reads held that K throughout; every first read precedes
    every second read, so when no pair changed all the Ks held at once (between the rounds) and
    their sum is a true simultaneous sum. A changed pair makes the sample None (not a guess)."""

    def read() -> list[tuple[int, int]]:
        out = []
        for stub in stubs:
            stats = stub.GetStats(spb.GetStatsRequest(), metadata=metadata, timeout=timeout)
            out.append((stats.lease_epoch, stats.budget_k))
        return out

    first, second = read(), read()
    return sum(k for _, k in first) if first == second else None


def spawn(name: str, args: list[str], work: Path) -> Proc:
    """Start ``echo-sd <args> --ready-file ...`` with its output in ``work/<name>.log``."""
    ready = work / f"{name}.ready.json"
    ready.unlink(missing_ok=True)
    log = work / f"{name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "echo_server.cli", "--log-level", "info", *args]
    with log.open("ab") as out:  # the child keeps its own descriptor
        popen = subprocess.Popen(
            [*command, "--ready-file", str(ready)], stdout=out, stderr=out, env=env
        )
    return Proc(name, args, log, ready, popen)


def launch(
    name: str, args: list[str], work: Path, credentials: grpc.ChannelCredentials | None
) -> Proc:
    proc = spawn(name, args, work)
    proc.wait_ready(credentials)
    return proc


def open_channel(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
    if credentials is None:
        return grpc.insecure_channel(target)
    return grpc.secure_channel(target, credentials)


def wait_healthy(target: str, credentials: grpc.ChannelCredentials | None, deadline: float) -> None:
    """Poll the standard health check until SERVING (it needs no token)."""
    with open_channel(target, credentials) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"{target} never became healthy"
            time.sleep(0.1)
