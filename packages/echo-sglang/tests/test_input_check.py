"""Prompt token ids outside the vocabulary are refused before the scheduler (input_check.py);
the end-to-end check, a real server answering 400 and serving on, is in tests/sglang_server."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from echo_sglang.input_check import input_check_hook, out_of_vocab


def test_ids_inside_the_vocabulary_pass() -> None:
    assert out_of_vocab([0, 5, 9], 10) is None
    assert out_of_vocab([], 10) is None
    assert out_of_vocab(None, 10) is None


@pytest.mark.parametrize(
    ("ids", "where"),
    [([1, 10], "input_ids[1] = 10"), ([-1], "input_ids[0] = -1"), ([3, True], "input_ids[1]"),
     ([2.0], "input_ids[0] = 2.0")],
)  # fmt: skip
def test_the_first_bad_id_is_named_with_the_valid_range(ids: list[object], where: str) -> None:
    problem = out_of_vocab(ids, 10)  # type: ignore[arg-type]
    assert problem is not None
    assert where in problem
    assert "[0, 10)" in problem


def test_the_hook_raises_what_sglang_turns_into_a_400() -> None:
    manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=49152))
    input_check_hook(manager, object(), [1, 2, 49151])  # in range: no error
    with pytest.raises(ValueError, match=r"input_ids\[0\] = 1000000000"):
        input_check_hook(manager, object(), input_ids=[10**9])
