"""Tokenizer wrapper: encode/decode, chat template, end-of-sequence ids, streaming decode.

Built by transformers' ``AutoTokenizer`` from a GGUF's metadata (vocabulary, merges, chat
template) or from a HF directory (``tokenizer.json``), offline only. Encoding and decoding use the
fast ``tokenizers.Tokenizer`` underneath; transformers renders the Jinja chat template.

Converting a GGUF's vocabulary is slow (about 4-5 s for SmolLM2's 49,152 tokens on the 2-core
VMs: transformers parses every field of the file in Python), so the converted tokenizer is saved
once, as a HF directory (``save_pretrained``), under ``TOKENIZER_CACHE/<key>``, and later loads
read that (about 0.3 s). The key hashes the GGUF's resolved path, size and modification time and
the transformers version, so a changed file or converter is converted again; a cache that cannot
be written (read-only home) is skipped with a warning, and one that cannot be read is converted
again and rewritten. ``ECHO_TOKENIZER_CACHE=off`` disables it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from echo_server.model.errors import ModelLoadError

log = structlog.get_logger(__name__)

TOKENIZER_CACHE = Path.home() / ".cache" / "echo" / "tokenizers"
"""Where tokenizers converted from GGUF files are kept (module docstring)."""

REPLACEMENT_CHAR = "\ufffd"
"""What a decoder emits for an incomplete UTF-8 sequence: never stream it mid-character."""


class Tokenizer:
    """Text <-> token ids for one model (see the module docstring)."""

    def __init__(self, hf_tokenizer: Any, extra_eos_ids: Sequence[int] = ()) -> None:
        self._hf = hf_tokenizer
        self._fast = hf_tokenizer.backend_tokenizer
        eos = [int(hf_tokenizer.eos_token_id)] if hf_tokenizer.eos_token_id is not None else []
        self.eos_ids: frozenset[int] = frozenset([*eos, *extra_eos_ids])
        self.bos_id: int | None = hf_tokenizer.bos_token_id
        self.vocab_size: int = int(self._fast.get_vocab_size(with_added_tokens=True))

    @property
    def has_chat_template(self) -> bool:
        return bool(self._hf.chat_template)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` (raw: no BOS unless asked)."""
        return list(self._fast.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._fast.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def render_chat(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The chat template applied to ``messages`` (``{"role", "content"}`` dicts), as text."""
        if not self.has_chat_template:
            raise ModelLoadError("this tokenizer has no chat template; send the prompt raw")
        text = self._hf.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return str(text)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the rendered chat (the template writes every special token itself)."""
        return self.encode(self.render_chat(messages, add_generation_prompt))

    def detokenizer(self, context_ids: Sequence[int] = ()) -> IncrementalDetokenizer:
        """A streaming decoder; ``context_ids`` (last prompt tokens) fix leading-space rules."""
        return IncrementalDetokenizer(self, context_ids)


class IncrementalDetokenizer:
    """Decode a growing id list and emit only the new, stable text.

    Keeps two offsets into the ids: text up to ``read`` has been emitted; ``prefix`` starts a
    short window re-decoded for context. Each push decodes ``ids[prefix:]`` and
    ``ids[prefix:read]``; the difference is emitted unless it ends in an incomplete UTF-8
    character (U+FFFD), which waits for the next token. Cost per push: O(window), not O(length).
    """

    def __init__(self, tokenizer: Tokenizer, context_ids: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._ids = list(context_ids)
        self._prefix = 0
        self._read = len(self._ids)
        self.text = ""

    def push(self, new_ids: Sequence[int]) -> str:
        """Append ids; return the newly stable text (possibly empty)."""
        self._ids.extend(int(i) for i in new_ids)
        return self._emit(final=False)

    def flush(self) -> str:
        """Emit whatever is left, even an incomplete character (end of the stream)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        before = self._tok.decode(self._ids[self._prefix : self._read])
        full = self._tok.decode(self._ids[self._prefix :])
        if len(full) <= len(before) or (full.endswith(REPLACEMENT_CHAR) and not final):
            return ""
        delta = full[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        self.text += delta
        return delta


def _generation_eos(path: Path) -> list[int]:
    gen = path / "generation_config.json"
    if not gen.is_file():
        return []
    eos = json.loads(gen.read_text()).get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, list) else [int(eos)]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Tokenizer of a GGUF file or a HF model directory, offline."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ModelLoadError("loading a tokenizer needs `transformers` (extra `models`)") from exc
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return Tokenizer(_gguf_tokenizer(path, AutoTokenizer, _cache_dir()))
    if path.is_dir():
        hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        return Tokenizer(hf, _generation_eos(path))
    raise ModelLoadError(f"no tokenizer at {path}: expected a .gguf file or a model directory")


def _cache_dir() -> Path | None:
    return None if os.environ.get("ECHO_TOKENIZER_CACHE", "") == "off" else TOKENIZER_CACHE


def gguf_cache_key(path: Path) -> str:
    """The cache entry of the tokenizer of the GGUF at ``path`` (module docstring)."""
    import transformers

    stat = path.resolve().stat()
    ident = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _gguf_tokenizer(path: Path, auto: Any, cache: Path | None) -> Any:
    """The HF tokenizer of the GGUF at ``path``: from ``cache`` if converted before, else
    converted now and saved there (module docstring)."""
    entry = cache / gguf_cache_key(path) if cache is not None else None
    if entry is not None and (entry / "tokenizer.json").is_file():
        try:
            return auto.from_pretrained(str(entry), local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("tokenizer_cache_unreadable", path=str(entry), error=str(exc))
    hf = auto.from_pretrained(str(path.parent), gguf_file=path.name)
    if entry is not None:
        _save(hf, entry)
    return hf


def _save(hf: Any, entry: Path) -> None:
    """Write ``hf`` to ``entry`` whole or not at all: into a temporary sibling renamed into place;
    if another process got there first, its entry stands and ours is dropped."""
    tmp: Path | None = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
        hf.save_pretrained(str(tmp))
        if entry.exists():  # a broken entry (we converted because it did not load)
            shutil.rmtree(entry, ignore_errors=True)
        tmp.rename(entry)
        tmp = None
    except OSError as exc:
        if not (entry / "tokenizer.json").is_file():
            log.warning("tokenizer_cache_not_written", path=str(entry), error=str(exc))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
