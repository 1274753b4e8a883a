"""Tokenizer of the embedded GGUF: round trips, ChatML template, EOS, streaming decode."""

from __future__ import annotations

import pytest

from echo_server.model import LoadedModel
from echo_server.model.tokenizer import REPLACEMENT_CHAR

pytestmark = pytest.mark.slow

TEXT = 'def greet(name: str) -> str:\n    return f"Héllo, {name} 🙂 — 你好"\n'


def test_encode_decode_round_trip(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    ids = tok.encode(TEXT)
    assert tok.bos_id not in ids  # raw encoding adds nothing
    assert tok.decode(ids) == TEXT


def test_chatml_template_from_the_gguf(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    text = tok.render_chat([{"role": "user", "content": "Hi"}])
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert tok.decode(ids, skip_special_tokens=False) == text
    im_end = tok.encode("<|im_end|>")
    assert len(im_end) == 1  # special tokens stay whole
    assert im_end[0] in tok.eos_ids


def test_streaming_emits_exactly_the_full_text_and_never_a_partial_character(
    smollm: LoadedModel,
) -> None:
    tok = smollm.tokenizer
    ids = tok.encode(TEXT)
    stream = tok.detokenizer()
    chunks = [stream.push([i]) for i in ids] + [stream.flush()]
    assert "".join(chunks) == TEXT == stream.text
    assert not any(REPLACEMENT_CHAR in c for c in chunks)
    assert sum(1 for c in chunks if c) < len(ids)  # multi-token characters were held back


def test_streaming_with_prompt_context_and_special_tokens(smollm: LoadedModel) -> None:
    tok = smollm.tokenizer
    prompt = tok.encode("Say hi:")
    answer = tok.encode(" Hello there!") + sorted(tok.eos_ids)[:1]
    stream = tok.detokenizer(context_ids=prompt[-3:])
    out = "".join(stream.push([i]) for i in answer) + stream.flush()
    assert out == " Hello there!"  # leading space kept, EOS skipped
