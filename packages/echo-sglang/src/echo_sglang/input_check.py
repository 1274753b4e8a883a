"""Refuse prompt token ids outside the model's vocabulary before they reach the scheduler.

SGLang 0.5.23 checks a ``/generate`` request's ``input_ids`` for length but not for range: an id
``>= vocab_size`` reaches the embedding lookup inside the scheduler, whose ``IndexError`` takes
the whole server down (seen on the CPU with plain SGLang as well as with ECHO). This BEFORE hook
on ``TokenizerManager._validate_one_request`` raises the ``ValueError`` SGLang already turns into
an HTTP 400 for its own checks, naming the first bad id and the valid range.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"


def out_of_vocab(input_ids: Sequence[int] | None, vocab_size: int) -> str | None:
    """Why ``input_ids`` cannot be embedded, or None when every id lies in [0, vocab_size)."""
    for i, token in enumerate(input_ids or ()):
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab_size:
            return (
                f"input_ids[{i}] = {token!r} is not a token id of this model "
                f"(valid range [0, {vocab_size}))"
            )
    return None


def input_check_hook(manager: Any, obj: Any, input_ids: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``_validate_one_request(obj, input_ids)``: ValueError for out-of-range ids."""
    vocab = getattr(getattr(manager, "model_config", None), "vocab_size", None)
    if vocab is None:
        return
    problem = out_of_vocab(input_ids, int(vocab))
    if problem is not None:
        raise ValueError(problem)
