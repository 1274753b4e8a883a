"""The HTTP API driven by the official ``openai`` SDK against a real node on loopback."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import grpc
import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from echo_proto.serving.v1 import serving_pb2 as spb
from echo_proto.serving.v1 import serving_pb2_grpc
from echo_server.engine import Engine
from echo_server.engine.report import StepReport

from .conftest import MODEL, LiveNodeFactory

PROMPT = "def fibonacci(n):"
QUESTION = "Name three primary colours."


def client(url: str, token: str = "unused") -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0, timeout=120.0)


def plain_cli(prompt: str, max_tokens: int, raw: bool) -> str:
    """What ``echo-sd generate --policy plain`` prints (greedy plain decoding)."""
    argv = [sys.executable, "-m", "echo_server.cli", "generate", "--policy", "plain"]
    argv += ["--max-tokens", str(max_tokens), "--drafter", "ngram", prompt]
    argv += ["--raw"] if raw else []
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    return out.stdout.removesuffix("\n")


def test_greedy_completion_equals_plain_decoding_of_the_cli(live_node: LiveNodeFactory) -> None:
    with live_node() as node, client(node.http_url) as api:
        reply = api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
        streamed = api.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True
        )
        pieces = list(streamed)
    assert reply.choices[0].text == plain_cli(PROMPT, 24, raw=True)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 24
    assert "".join(p.choices[0].text for p in pieces) == reply.choices[0].text
    assert pieces[-1].choices[0].finish_reason == "length"
    stats = reply.model_extra or {}
    assert stats["echo"]["decode_steps"] <= 24


def test_chat_stream_matches_unary_chat_and_grpc_chat(live_node: LiveNodeFactory) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    with live_node() as node, client(node.http_url) as api:
        unary = api.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=20,
            temperature=0,
        )
        chunks = list(
            api.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_tokens=20,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        with grpc.insecure_channel(node.grpc_target) as channel:
            stub = serving_pb2_grpc.GenerationServiceStub(channel)
            via_grpc = stub.Generate(
                spb.GenerateRequest(
                    text=QUESTION, chat=True, sampling=spb.SamplingParams(max_tokens=20)
                ),
                timeout=120,
            )
    text = unary.choices[0].message.content
    assert text
    assert text == via_grpc.text
    assert unary.usage is not None
    assert unary.usage.prompt_tokens == via_grpc.stats.prompt_tokens
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == unary.usage.completion_tokens
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length")
    assert all(f is None for f in finishes[:-1])


def test_models_and_impossible_parameters_name_the_field(live_node: LiveNodeFactory) -> None:
    with live_node() as node, client(node.http_url) as api:
        assert [m.id for m in api.models.list()] == [MODEL]
        cases: dict[str, dict[str, Any]] = {
            "top_p": {"top_p": 1.5},
            "temperature": {"temperature": -1.0},
            "n": {"n": 2},
            "max_tokens": {"max_tokens": 0},
            "stop": {"stop": [""]},
            "seed": {"seed": -3},
            "presence_penalty": {"presence_penalty": 0.5},
            "logprobs": {"logprobs": 2},
            "policy": {"extra_body": {"policy": "chain"}},
            "top_k": {"extra_body": {"top_k": -1}},
        }
        for field, extra in cases.items():
            with pytest.raises(openai.BadRequestError) as info:
                api.completions.create(model=MODEL, prompt="hi", **extra)
            body = info.value.body
            assert isinstance(body, dict), (field, body)
            assert body["param"] == field, (field, body)
        with pytest.raises(openai.NotFoundError):
            api.completions.create(model="another-model", prompt="hi")
        with pytest.raises(openai.BadRequestError) as info:
            api.completions.create(model=MODEL, prompt=" " * 3)
        assert info.value.body["param"] == "prompt"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as info:
            api.completions.create(model=MODEL, prompt="word " * 3000)  # beyond the KV pool
        assert info.value.code == "context_length_exceeded"
        # after all that, the node still answers
        ok = api.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=4, temperature=0)
        assert ok.usage is not None
        assert ok.usage.completion_tokens == 4


def test_bearer_token_guards_every_path_but_health(live_node: LiveNodeFactory) -> None:
    with live_node(token="s3cret") as node:
        with client(node.http_url, token="wrong") as api, pytest.raises(openai.AuthenticationError):
            api.models.list()
        with client(node.http_url, token="s3cret") as api:
            assert [m.id for m in api.models.list()] == [MODEL]
        for path in ("/v1/models", "/no/such/path", "/metrics"):
            r = httpx.get(node.http_url + path)
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(node.http_url + "/health").status_code == 200
        metrics = httpx.get(
            node.http_url + "/metrics", headers={"Authorization": "Bearer s3cret"}
        ).text
        assert 'echo_node_requests_refused_total{code="UNAUTHENTICATED"}' in metrics


def hold_after_first_text(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, release: threading.Event
) -> None:
    """Pause ``engine``'s thread before the step after the one that emitted the first text,
    until ``release`` is set (at most 60 s)."""
    step, seen = engine.step, threading.Event()

    def held() -> StepReport:
        if seen.is_set():
            release.wait(60)
        report = step()
        if any(e.text for e in report.events):
            seen.set()
        return report

    monkeypatch.setattr(engine, "step", held)


def test_full_queue_is_429_with_retry_after_and_disconnect_frees_the_slot(
    live_node: LiveNodeFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Admission cannot exceed capacity: the in-flight count lives on the event loop only, and a
    # request leaves it only with its terminal item. So when the second request was admitted
    # under load (2026-12-05) the first had already ended in the engine, and nothing held it: a
    # stream its client stops reading is no brake on the engine, which runs the request to
    # max_tokens (or fails it, which the test, reading one line, never saw) and frees the slot,
    # racing the test thread's next request. The engine is now paused after the first text, so
    # the first request holds the slot however the threads are scheduled; admission answers on
    # the event loop, so the 429 needs no step. After the release the stream must go on
    # without an error.
    with live_node(max_batch=1, max_waiting=0) as node:
        release = threading.Event()
        hold_after_first_text(node.engine, monkeypatch, release)
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 500, "stream": True}
        body |= {"ignore_eos": True}
        with httpx.stream("POST", node.http_url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            next(lines)  # the request holds the node's only slot (its engine paused)
            try:
                with client(node.http_url) as api, pytest.raises(openai.RateLimitError) as info:
                    api.completions.create(model=MODEL, prompt="hi", max_tokens=2)
            finally:
                release.set()
            assert int(info.value.response.headers["retry-after"]) >= 1
            later = next(line for line in lines if line)
            assert '"error"' not in later, later
        # the client went away mid-stream: the engine cancels the request and frees the slot
        deadline = time.monotonic() + 60
        with client(node.http_url) as api:
            while True:
                try:
                    done = api.completions.create(model=MODEL, prompt="hi", max_tokens=2)
                    break
                except openai.RateLimitError:
                    assert time.monotonic() < deadline, "the slot was never freed"
                    time.sleep(0.1)
        assert done.usage is not None
        assert done.usage.completion_tokens == 2


def test_timeout_cancels_and_draining_answers_503(live_node: LiveNodeFactory) -> None:
    with live_node(max_batch=1, max_waiting=1, grace_s=30.0) as node, client(node.http_url) as api:
        with pytest.raises(openai.APIStatusError) as info:
            api.completions.create(
                model=MODEL,
                prompt="Once upon a time",
                max_tokens=500,
                extra_body={"timeout_s": 0.3, "ignore_eos": True},
            )
        assert info.value.status_code == 504
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 40, "stream": True}
        with httpx.stream("POST", node.http_url + "/v1/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()
            next(lines)
            node.begin_shutdown()  # SIGTERM: drain with 30 s grace; this stream may finish
            deadline = time.monotonic() + 30
            while httpx.get(node.http_url + "/health").status_code != 503:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            with pytest.raises(openai.APIStatusError) as info:
                api.completions.create(model=MODEL, prompt="hi", max_tokens=2)
            assert info.value.status_code == 503
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"


def test_oversized_and_malformed_bodies_are_refused_cleanly(live_node: LiveNodeFactory) -> None:
    with live_node(max_body_bytes=2048) as node:
        big = httpx.post(node.http_url + "/v1/completions", json={"prompt": "x" * 4096})
        assert big.status_code == 413
        assert big.json()["error"]["type"] == "invalid_request_error"
        bad = httpx.post(
            node.http_url + "/v1/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        assert bad.status_code == 400
        assert "JSON" in bad.json()["error"]["message"]
        missing = httpx.post(node.http_url + "/v1/chat/completions", json={"model": MODEL})
        assert missing.status_code == 400
        assert missing.json()["error"]["param"] == "messages"
        wrong_method = httpx.get(node.http_url + "/v1/completions")
        assert wrong_method.status_code == 405
        ok = httpx.post(
            node.http_url + "/v1/completions",
            json={"model": MODEL, "prompt": "1, 2,", "max_tokens": 3},
            timeout=60,
        )
        assert ok.status_code == 200
        assert ok.json()["usage"]["completion_tokens"] == 3
