"""Prompt sets of the benchmark (echo_lab.bench.workloads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo_lab.bench.workloads import (
    EXCERPT_CHARS,
    first_paragraphs,
    load_workload,
    load_workloads,
    summarization,
)
from echo_server.prompts import PromptSetError


def test_first_paragraphs_stops_before_the_limit() -> None:
    text = "aaaa\n\nbbbb\n\ncccc"
    assert first_paragraphs(text, 10) == "aaaa\n\nbbbb"
    assert first_paragraphs("x" * 50, 10) == "x" * 10


def test_summarization_is_deterministic_chat_and_bounded() -> None:
    a, b = summarization(5), summarization(5)
    assert [p.prompt_id for p in a] == [p.prompt_id for p in b]
    assert len(a) == 5
    assert all(p.chat and p.prompt_id.startswith("summarize/") for p in a)
    assert all(len(p.text) < EXCERPT_CHARS + 200 for p in a)


def test_jsonl_workload_is_named_after_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"prompt": "hi", "max_tokens": 3}) + "\n", encoding="utf-8")
    workloads = load_workloads([], None, path)
    assert [w.name for w in workloads] == ["mine"]
    assert workloads[0].prompts[0].max_tokens == 3


def test_unknown_workload_names_the_known_ones() -> None:
    with pytest.raises(PromptSetError, match="humaneval"):
        load_workload("gsm8k")
