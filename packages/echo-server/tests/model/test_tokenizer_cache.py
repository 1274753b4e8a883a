"""The converted-GGUF tokenizer cache (model/tokenizer.py): a cached tokenizer behaves exactly as
the one converted from the GGUF, a broken entry is converted again, an unwritable cache is skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from transformers import AutoTokenizer

from echo_server.model import tokenizer as tokenizer_module
from echo_server.model.loader import LoadedModel, resolve_source
from echo_server.model.tokenizer import Tokenizer, gguf_cache_key

TEXTS = (
    "def f(x):\n    return x ** 2  # ünïcode, 数字, emoji 🙂",
    "<|im_start|>user\nhello<|im_end|>\n",
    "   leading spaces\tand\ttabs\r\n",
)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


class CountingAuto:
    """``AutoTokenizer`` that counts GGUF conversions; ``converted``, if given, is returned for
    them instead of converting again (each conversion costs seconds)."""

    def __init__(self, converted: Any = None) -> None:
        self.conversions, self.converted = 0, converted

    def from_pretrained(self, name: str, **kwargs: Any) -> Any:
        if "gguf_file" in kwargs:
            self.conversions += 1
            if self.converted is not None:
                return self.converted
        return AutoTokenizer.from_pretrained(name, **kwargs)


def behaviour(hf: Any) -> tuple[object, ...]:
    tok = Tokenizer(hf)
    ids = [tok.encode(t) for t in TEXTS]
    return (
        ids,
        [tok.decode(i, skip_special_tokens=False) for i in ids],
        hf.apply_chat_template(MESSAGES, add_generation_prompt=True),
        sorted(tok.eos_ids),
        tok.bos_id,
        tok.vocab_size,
    )


@pytest.fixture(scope="module")
def gguf() -> Path:
    path = resolve_source(None)
    assert path.suffix == ".gguf"
    return path


def test_a_cached_tokenizer_behaves_as_the_converted_one(
    gguf: Path, smollm: LoadedModel, tmp_path: Path
) -> None:
    auto = CountingAuto()
    converted = tokenizer_module._gguf_tokenizer(gguf, auto, tmp_path)
    assert auto.conversions == 1
    assert (tmp_path / gguf_cache_key(gguf) / "tokenizer.json").is_file()
    cached = tokenizer_module._gguf_tokenizer(gguf, auto, tmp_path)
    assert auto.conversions == 1  # read from the cache
    assert behaviour(cached) == behaviour(converted)
    assert behaviour(cached)[0] == [smollm.tokenizer.encode(t) for t in TEXTS]


def test_a_broken_entry_is_converted_again_and_rewritten(
    gguf: Path, smollm: LoadedModel, tmp_path: Path
) -> None:
    entry = tmp_path / gguf_cache_key(gguf)
    entry.mkdir()
    (entry / "tokenizer.json").write_text("{not json")
    auto = CountingAuto(smollm.tokenizer._hf)
    with capture_logs() as logs:
        tokenizer_module._gguf_tokenizer(gguf, auto, tmp_path)
    assert auto.conversions == 1
    assert [e["event"] for e in logs] == ["tokenizer_cache_unreadable"]
    again = tokenizer_module._gguf_tokenizer(gguf, auto, tmp_path)
    assert auto.conversions == 1  # the rewritten entry loads
    assert behaviour(again) == behaviour(smollm.tokenizer._hf)


def test_an_unwritable_cache_is_skipped_with_a_warning(
    gguf: Path, smollm: LoadedModel, tmp_path: Path
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    auto = CountingAuto(smollm.tokenizer._hf)
    with capture_logs() as logs:
        hf = tokenizer_module._gguf_tokenizer(gguf, auto, blocked / "cache")
    assert hf is smollm.tokenizer._hf
    assert [e["event"] for e in logs] == ["tokenizer_cache_not_written"]


def test_the_cache_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECHO_TOKENIZER_CACHE", "off")
    assert tokenizer_module._cache_dir() is None
    monkeypatch.delenv("ECHO_TOKENIZER_CACHE")
    assert tokenizer_module._cache_dir() == tokenizer_module.TOKENIZER_CACHE
