"""The prompt-lookup drafter proposes real continuations with count-based probabilities."""

from __future__ import annotations

import math

import pytest
import torch

from echo_server.drafting import ExpandRequest, NgramDrafter


def _expand(
    drafter: NgramDrafter, paths: list[list[int]], topk: int = 3, request: int = 0
) -> list[list[tuple[int, float]]]:
    m = len(paths)
    out = drafter.expand(
        ExpandRequest(
            request=torch.full((m,), request, dtype=torch.int64),
            node=torch.arange(m, dtype=torch.int64) - 1,
            path=paths,
            topk=torch.full((m,), topk, dtype=torch.int64),
        )
    )
    per_node: list[list[tuple[int, float]]] = [[] for _ in range(m)]
    for s, t, lp in zip(out.source.tolist(), out.token.tolist(), out.logprob.tolist(), strict=True):
        per_node[s].append((t, lp))
    return per_node


def test_single_earlier_occurrence_gives_half_probability() -> None:
    drafter = NgramDrafter(max_n=2)
    drafter.begin_step([[1, 2, 3, 1, 2]], ["r"])
    (children,) = _expand(drafter, [[]])
    assert [t for t, _ in children] == [3]
    assert children[0][1] == pytest.approx(math.log(0.5))


def test_path_tokens_extend_the_suffix() -> None:
    drafter = NgramDrafter(max_n=2)
    drafter.begin_step([[1, 2, 3, 4, 1, 2]], ["r"])
    root, after_three = _expand(drafter, [[], [3]])
    assert [t for t, _ in root] == [3]
    assert [t for t, _ in after_three] == [4]


def test_counts_rank_children_and_respect_topk() -> None:
    drafter = NgramDrafter(max_n=1)
    drafter.begin_step([[7, 1, 7, 2, 7, 1, 7]], ["r"])
    (children,) = _expand(drafter, [[]], topk=1)
    assert [t for t, _ in children] == [1]
    assert children[0][1] == pytest.approx(math.log(2 / 4))
    (children,) = _expand(drafter, [[]], topk=5)
    assert [t for t, _ in children] == [1, 2]


def test_unseen_suffix_proposes_nothing() -> None:
    drafter = NgramDrafter(max_n=3)
    drafter.begin_step([[1, 2, 3]], ["r"])
    assert _expand(drafter, [[]]) == [[]]


def test_incremental_context_matches_rebuild() -> None:
    incremental, fresh = NgramDrafter(), NgramDrafter()
    incremental.begin_step([[5, 6, 5]], ["r"])
    incremental.begin_step([[5, 6, 5, 6, 7, 5, 6]], ["r"])
    fresh.begin_step([[5, 6, 5, 6, 7, 5, 6]], ["r"])
    assert _expand(incremental, [[], [5]]) == _expand(fresh, [[], [5]])


def test_rewritten_context_rebuilds_the_index() -> None:
    drafter = NgramDrafter(max_n=1)
    drafter.begin_step([[1, 2, 1]], ["r"])
    drafter.begin_step([[3, 4, 3]], ["r"])
    assert [t for t, _ in _expand(drafter, [[]])[0]] == [4]


def test_bad_configuration_is_rejected() -> None:
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(max_n=1, min_n=2)
    with pytest.raises(ValueError, match="alpha"):
        NgramDrafter(alpha=0.0)
