"""The open-loop benchmark's arithmetic, on hand-computed cases (no server, no clock)."""

from __future__ import annotations

import itertools
import math

import pytest

from echo_lab.bench.intervals import percentile
from echo_lab.bench.serve_load import (
    Endpoint,
    RequestResult,
    arrival_offsets,
    summarize,
)


def test_percentile_interpolates_between_order_statistics() -> None:
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 99) == pytest.approx(4.96)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))


def test_poisson_schedule_is_seeded_and_has_the_asked_rate() -> None:
    a, b = arrival_offsets(4000, 2.0, seed=3), arrival_offsets(4000, 2.0, seed=3)
    assert a == b
    assert a[0] == 0.0
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert min(gaps) >= 0
    mean = sum(gaps) / len(gaps)  # Exp(2): mean 0.5, sd 0.5; 4 sd of the mean of 3999 gaps
    assert abs(mean - 0.5) < 4 * 0.5 / math.sqrt(len(gaps))
    assert arrival_offsets(3, math.inf, seed=0) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="rate must be > 0"):
        arrival_offsets(3, 0.0, seed=0)


def test_summary_of_two_requests_and_one_error() -> None:
    first = RequestResult("a", sent_s=10.0, ttft_s=0.2, e2e_s=1.2, output_tokens=11)
    first.chunk_s = [10.2, 10.7, 11.2]  # 3 chunks: ITL 500 ms, 500 ms
    second = RequestResult("b", sent_s=11.0, ttft_s=0.4, e2e_s=0.4, output_tokens=1)
    second.chunk_s = [11.4]
    failed = RequestResult("c", error="HTTP 429")
    s = summarize([first, second, failed], duration_s=2.0)
    assert (s["completed"], s["errors"]) == (2.0, 1.0)
    assert s["request_throughput"] == 1.0
    assert s["output_tok_s"] == 6.0
    assert s["tokens_per_chunk"] == 12 / 4
    assert s["tpot_p50_ms"] == pytest.approx(100.0)  # (1.2 - 0.2) s / 10 tokens; b has no TPOT
    assert s["ttft_p50_ms"] == pytest.approx(300.0)
    assert s["itl_p99_ms"] == pytest.approx(500.0)
    assert s["e2e_p50_ms"] == pytest.approx(800.0)


def test_endpoint_urls_are_checked() -> None:
    assert Endpoint.parse("echo=http://127.0.0.1:8000/").url == "http://127.0.0.1:8000"
    assert Endpoint.parse("plain=grpc://127.0.0.1:50051").is_grpc
    with pytest.raises(ValueError, match="need NAME="):
        Endpoint.parse("x=ftp://host:1")
