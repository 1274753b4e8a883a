"""Open-loop load against a running node (HTTP or gRPC), as a client of the server sees it.

Arrivals are a Poisson process of rate ``lambda`` requests/s: inter-arrival gaps are drawn
``Exp(lambda)`` from a seeded generator, so every endpoint of a round gets the same schedule
(``rate = inf`` sends everything at once; ``max_concurrency`` caps requests in flight, which
with ``inf`` is a fixed-concurrency closed loop). Every request streams, and per request:

- TTFT: send to the first chunk that carries text;
- E2E: send to the last byte;
- TPOT: ``(E2E - TTFT) / (output_tokens - 1)`` (requests of one token have none);
- ITL: the gaps between consecutive text-carrying chunks. A speculative step commits several
  tokens at once and sends them as one chunk, so ITL is per chunk, not per token (as in other
  serving benchmarks); ``tokens_per_chunk`` says how many tokens a chunk carries on average.

Per run: ``request_throughput = completed / duration`` and ``output_tok_s = sum(output_tokens)
/ duration`` with ``duration`` from the first send to the last completion; percentiles are
linear interpolation between order statistics (:func:`percentile`).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import grpc
import httpx

from echo_controller.security import auth_metadata
from echo_lab.bench.intervals import percentile
from echo_proto.serving.v1 import serving_pb2 as spb
from echo_proto.serving.v1 import serving_pb2_grpc
from echo_server.prompts import Prompt

SCHEMES = ("http://", "https://", "grpc://")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A named server: ``http(s)://host:port`` (OpenAI API) or ``grpc://host:port``."""

    name: str
    url: str

    def __post_init__(self) -> None:
        if not self.name or not self.url.startswith(SCHEMES):
            raise ValueError(f"endpoint {self.name}={self.url}: need NAME=http(s)://... or grpc://")

    @property
    def is_grpc(self) -> bool:
        return self.url.startswith("grpc://")

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        name, sep, url = text.partition("=")
        if not sep:
            name, url = text.split("://", 1)[-1], text
        return cls(name, url.rstrip("/"))


@dataclass(frozen=True, slots=True)
class LoadSpec:
    max_tokens: int = 128
    temperature: float = 0.0
    ignore_eos: bool = False
    model: str | None = None  # HTTP ``model`` field; None: ask the server's GET /v1/models
    token: str | None = None
    timeout_s: float = 600.0


@dataclass(slots=True)
class RequestResult:
    prompt_id: str
    sent_s: float = 0.0  # perf_counter
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_s: list[float] = field(default_factory=list)  # arrival of each text-carrying chunk
    output_tokens: int = 0
    mean_accepted_length: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_s is not None


def arrival_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Send times (s after the start) of ``n`` Poisson arrivals at ``rate``/s (module doc)."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0 (inf: all at once), got {rate}")
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def summarize(results: Sequence[RequestResult], duration_s: float) -> dict[str, float]:
    """Throughput and latency figures of one run (module docstring); times in ms."""
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    e2e = [r.e2e_s * 1000 for r in ok if r.e2e_s is not None]
    tpot = [
        (r.e2e_s - r.ttft_s) * 1000 / (r.output_tokens - 1)
        for r in ok
        if r.e2e_s is not None and r.ttft_s is not None and r.output_tokens > 1
    ]
    itl = [(b - a) * 1000 for r in ok for a, b in zip(r.chunk_s, r.chunk_s[1:], strict=False)]
    tokens = sum(r.output_tokens for r in ok)
    chunks = sum(len(r.chunk_s) for r in ok)
    mal = [r.mean_accepted_length for r in ok if r.mean_accepted_length is not None]
    out = {
        "completed": float(len(ok)),
        "errors": float(len(results) - len(ok)),
        "duration_s": duration_s,
        "request_throughput": len(ok) / duration_s if duration_s > 0 else math.nan,
        "output_tok_s": tokens / duration_s if duration_s > 0 else math.nan,
        "output_tokens": float(tokens),
        "tokens_per_chunk": tokens / chunks if chunks else math.nan,
        "mean_accepted_length": sum(mal) / len(mal) if mal else math.nan,
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        out[f"{name}_p50_ms"] = percentile(values, 50)
        out[f"{name}_p99_ms"] = percentile(values, 99)
    return out


class _Client:
    """One endpoint's connection; :meth:`send` streams one prompt into a result."""

    def __init__(self, endpoint: Endpoint, spec: LoadSpec) -> None:
        self.endpoint, self.spec = endpoint, spec
        self._http: httpx.AsyncClient | None = None
        self._channel: grpc.aio.Channel | None = None
        self._model = spec.model

    async def __aenter__(self) -> _Client:
        if self.endpoint.is_grpc:
            self._channel = grpc.aio.insecure_channel(self.endpoint.url.removeprefix("grpc://"))
        else:
            headers = {"Authorization": f"Bearer {self.spec.token}"} if self.spec.token else {}
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
            self._http = httpx.AsyncClient(
                base_url=self.endpoint.url,
                headers=headers,
                timeout=self.spec.timeout_s,
                limits=limits,
            )
            if self._model is None:
                r = await self._http.get("/v1/models")
                r.raise_for_status()
                self._model = str(r.json()["data"][0]["id"])
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._http is not None:
            await self._http.aclose()
        if self._channel is not None:
            await self._channel.close()

    async def send(self, prompt: Prompt, result: RequestResult) -> None:
        result.sent_s = time.perf_counter()
        try:
            if self._channel is not None:
                await self._send_grpc(prompt, result)
            else:
                await self._send_http(prompt, result)
        except (httpx.HTTPError, grpc.aio.AioRpcError, ValueError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        result.e2e_s = time.perf_counter() - result.sent_s if result.error is None else None

    def _chunk(self, result: RequestResult) -> None:
        now = time.perf_counter()
        if result.ttft_s is None:
            result.ttft_s = now - result.sent_s
        result.chunk_s.append(now)

    async def _send_http(self, prompt: Prompt, result: RequestResult) -> None:
        assert self._http is not None
        spec = self.spec
        body: dict[str, object] = {
            "model": self._model,
            "max_tokens": prompt.max_tokens or spec.max_tokens,
            "temperature": spec.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": spec.ignore_eos,
        }
        path = "/v1/chat/completions" if prompt.chat else "/v1/completions"
        if prompt.chat:
            body["messages"] = [{"role": "user", "content": prompt.text}]
        else:
            body["prompt"] = prompt.text
        async with self._http.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                result.error = f"HTTP {r.status_code}: {r.text[:200]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    result.error = str(event["error"].get("message"))
                    return
                if event.get("usage"):
                    result.output_tokens = int(event["usage"]["completion_tokens"])
                for choice in event.get("choices", ()):
                    text = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if text:
                        self._chunk(result)
                if "echo" in event:
                    result.mean_accepted_length = float(event["echo"]["mean_accepted_length"])

    async def _send_grpc(self, prompt: Prompt, result: RequestResult) -> None:
        assert self._channel is not None
        spec = self.spec
        stub = serving_pb2_grpc.GenerationServiceStub(self._channel)
        request = spb.GenerateRequest(
            text=prompt.text,
            chat=prompt.chat,
            sampling=spb.SamplingParams(
                temperature=spec.temperature,
                max_tokens=prompt.max_tokens or spec.max_tokens,
                ignore_eos=spec.ignore_eos,
            ),
        )
        call = stub.GenerateStream(
            spb.GenerateStreamRequest(request=request),
            timeout=spec.timeout_s,
            metadata=auth_metadata(spec.token),
        )
        async for message in call:
            if message.HasField("delta"):
                if message.delta.token_ids:
                    self._chunk(result)
            else:
                result.output_tokens = message.final.stats.output_tokens
                result.mean_accepted_length = message.final.stats.mean_accepted_length


async def run_load(
    endpoint: Endpoint,
    prompts: Sequence[Prompt],
    offsets: Sequence[float],
    spec: LoadSpec,
    max_concurrency: int | None = None,
    on_done: Callable[[RequestResult], None] = lambda _r: None,
) -> tuple[list[RequestResult], float]:
    """Send ``prompts[i]`` at ``offsets[i]`` s after the start; the results and the duration."""
    if len(prompts) != len(offsets):
        raise ValueError(f"{len(prompts)} prompts but {len(offsets)} send times")
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    results = [RequestResult(p.prompt_id) for p in prompts]
    async with _Client(endpoint, spec) as client:
        start = time.perf_counter()

        async def one(i: int) -> None:
            await asyncio.sleep(max(start + offsets[i] - time.perf_counter(), 0.0))
            if gate is None:
                await client.send(prompts[i], results[i])
            else:
                async with gate:
                    await client.send(prompts[i], results[i])
            on_done(results[i])

        await asyncio.gather(*(one(i) for i in range(len(prompts))))
        duration = time.perf_counter() - start
    return results, duration


def result_rows(results: Sequence[RequestResult]) -> list[dict[str, object]]:
    return [asdict(r) for r in results]
