"""Chat prompts the target writes itself (training/magpie.py): the filter, the cache, the model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest

from echo_lab.training.magpie import chat_queries, pre_query_template
from echo_server.model.loader import LoadedModel
from echo_server.prompts import mtbench


def _write(cache: Path, attempts: list[tuple[bool, str]]) -> None:
    lines = [
        json.dumps({"index": i, "ended": ended, "text": text})
        for i, (ended, text) in enumerate(attempts)
    ]
    cache.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_cached_attempts_are_filtered_in_order_without_sampling(tmp_path: Path) -> None:
    """Kept: ended by the target, 15-600 characters, new, no 8-word run of a benchmark. With
    enough cached attempts no model is needed (none is given)."""
    cache = tmp_path / "q.jsonl"
    good = "What is a good way to learn to cook at home?"
    _write(
        cache,
        [
            (True, good),
            (False, "A query the length cap cut short and never"),
            (True, "Hi there"),
            (True, good),
            (True, " ".join(mtbench()[0].text.split()[:12])),
            (True, "Can you explain how tides work in simple words?"),
            (True, "Never reached: two queries were kept before it."),
        ],
    )
    no_model = cast(LoadedModel, None)
    got = chat_queries(no_model, 2, cache)
    assert [(p.prompt_id, p.text, p.chat) for p in got] == [
        ("magpie/0", good, True),
        ("magpie/5", "Can you explain how tides work in simple words?", True),
    ]
    assert chat_queries(no_model, 0, cache) == []
    with pytest.raises(ValueError, match="count"):
        chat_queries(no_model, -1, cache)


def test_a_corrupt_cache_line_is_named(tmp_path: Path) -> None:
    cache = tmp_path / "q.jsonl"
    cache.write_text('{"index": 0, "ended": true, "text": "fine"}\nnot json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"q\.jsonl:2"):
        chat_queries(cast(LoadedModel, None), 1, cache)


def test_the_target_writes_queries_that_a_rerun_reads_back(
    smollm: LoadedModel, tmp_path: Path
) -> None:
    prefix = pre_query_template(smollm)
    assert prefix.endswith("user\n")
    assert "system" in prefix
    cache = tmp_path / "q.jsonl"
    first = chat_queries(smollm, 2, cache, max_tokens=48, batch=8)
    sampled = cache.read_text(encoding="utf-8").splitlines()
    assert len(sampled) == 8  # one round of ``batch`` attempts, the limit for 2 queries
    assert 1 <= len(first) <= 2
    assert all(p.prompt_id.startswith("magpie/") and p.chat and p.text for p in first)
    again = chat_queries(smollm, 2, cache, max_tokens=48, batch=8)
    assert again == first
    assert cache.read_text(encoding="utf-8").splitlines() == sampled  # nothing sampled twice
