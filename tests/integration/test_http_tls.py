"""An ``echo-sd serve`` process serving the OpenAI HTTP API over TLS with client certificates
and a bearer token (the same ones as its gRPC API), driven by the official ``openai`` SDK."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from .conftest import TOKEN, Certs, Proc, launch

MODEL = "smollm2-tls"


@pytest.fixture(scope="module")
def node(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    work: Path = tmp_path_factory.mktemp("http-node")
    args = [
        "serve",
        "--listen", "127.0.0.1:0",
        "--http-listen", "127.0.0.1:0",
        "--served-model-name", MODEL,
        "--tls-cert", str(certs.server_cert),
        "--tls-key", str(certs.server_key),
        "--tls-client-ca", str(certs.ca),
        "--token-file", str(certs.token_file),
        "--drafter", "ngram",
        "--threads", "1",
        "--max-batch", "2",
    ]  # fmt: skip
    proc = launch("http-node", args, work, certs.channel_credentials())
    yield proc
    proc.stop()


def _url(node: Proc) -> str:
    return f"https://127.0.0.1:{json.loads(node.ready.read_text())['http_port']}"


def _client(node: Proc, context: ssl.SSLContext, token: str) -> OpenAI:
    http = openai.DefaultHttpxClient(verify=context, timeout=120)  # the SDK's own HTTP client
    return OpenAI(base_url=f"{_url(node)}/v1", api_key=token, max_retries=0, http_client=http)


def test_https_with_client_certificate_and_token_serves_completions(
    node: Proc, certs: Certs
) -> None:
    with _client(node, certs.ssl_context(), TOKEN) as api:
        reply = api.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=4, temperature=0)
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 4


def test_https_refuses_a_wrong_token_and_a_missing_client_certificate(
    node: Proc, certs: Certs
) -> None:
    with (
        _client(node, certs.ssl_context(), "not-the-token") as api,
        pytest.raises(openai.AuthenticationError),
    ):
        api.models.list()
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        httpx.get(_url(node) + "/health", verify=certs.ssl_context(client_cert=False), timeout=10)
