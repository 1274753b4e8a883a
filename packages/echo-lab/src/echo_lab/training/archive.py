"""The self-distilled sequences' tokens, archived so the data outlives the machine that made it.

Generating the data costs hours of CPU (the target decodes every answer); its shards cost
gigabytes (a float16 feature row per token, four with EAGLE-3 layers). The tokens alone are a
few bytes per token, so they are archived, and the features are rebuilt from them by one
teacher-forced target forward per sequence: the target reads ``x_0..x_{T-1}`` in one prefill and
its final hidden state (and residual streams after the aux layers) at row ``t`` is ``f_t``, the
same function of ``x_0..x_t`` that the decode recorded (:mod:`echo_lab.training.selfdistill`),
up to float rounding of a different reduction order.

An archive is a gzip-compressed safetensors file (``.safetensors.gz``) holding ``tokens``
[sum(T+1)] int32, ``cu_tokens`` [S+1] int64, ``prompt_len`` [S] int32 and two UTF-8 byte tensors
(uint8): ``header``, JSON with ``format`` (:data:`ARCHIVE_FORMAT`), ``target`` (the model's name)
and ``sequence_ids``, and ``chat_attempts``, the text of the chat-query sampler's cache
(:mod:`echo_lab.training.magpie`, JSON lines), so a resumed run reads the queries instead of
sampling them again. Everything is in tensors (safetensors' own metadata map has no fixed
order), so the same contents give the same bytes. Reading checks all of it and raises
:class:`ArchiveError` naming what is wrong.
"""

from __future__ import annotations

import gzip
import itertools
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch
from safetensors import SafetensorError
from safetensors.torch import load, save
from torch import Tensor
from tqdm import tqdm

from echo_lab.training.selfdistill import (
    SHARD_GLOB,
    DistilledSequence,
    check_aux_layers,
    done_prompt_ids,
    next_shard_index,
    read_shard_tokens,
    write_shard,
)
from echo_server.kv.pool import KVPool
from echo_server.model.attention import ragged_positions
from echo_server.model.llama import LlamaModel

log = structlog.get_logger(__name__)

ARCHIVE_FORMAT = "echo-distill-tokens/1"


class ArchiveError(ValueError):
    """A token archive that cannot be read: missing, corrupt, another format or target."""


@dataclass(frozen=True, slots=True)
class ArchivedSequence:
    """One sequence's tokens: ``x_0..x_T`` (prompt + answer) and the prompt's length."""

    sequence_id: str
    tokens: tuple[int, ...]
    prompt_len: int


@dataclass(frozen=True, slots=True)
class Archive:
    """What an archive holds."""

    target: str
    sequences: list[ArchivedSequence]
    chat_attempts: str  # the chat-query sampler's cache file, verbatim ("" if none)


def write_archive(
    path: Path, target: str, seqs: Sequence[ArchivedSequence], chat_attempts: str = ""
) -> None:
    """Store ``seqs`` (sorted by id, so the file is a function of its contents) and the
    chat-query cache's text at ``path``, through a temp name."""
    ordered = sorted(seqs, key=lambda s: s.sequence_id)
    if len({s.sequence_id for s in ordered}) != len(ordered):
        raise ArchiveError("sequence ids must be unique")
    cu = [0]
    for s in ordered:
        cu.append(cu[-1] + len(s.tokens))
    header = {
        "format": ARCHIVE_FORMAT,
        "target": target,
        "sequence_ids": [s.sequence_id for s in ordered],
    }
    tensors = {
        "tokens": torch.tensor([t for s in ordered for t in s.tokens], dtype=torch.int32),
        "cu_tokens": torch.tensor(cu, dtype=torch.int64),
        "prompt_len": torch.tensor([s.prompt_len for s in ordered], dtype=torch.int32),
        "header": _utf8(json.dumps(header, sort_keys=True)),
        "chat_attempts": _utf8(chat_attempts),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(gzip.compress(save(tensors), compresslevel=9, mtime=0))
    tmp.rename(path)


def _utf8(text: str) -> Tensor:
    data = bytearray(text.encode("utf-8"))
    return torch.frombuffer(data, dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def _text(t: Tensor) -> str:
    return bytes(t.tolist()).decode("utf-8")


def read_archive(path: Path, target: str | None = None) -> Archive:
    """The archive at ``path``; with ``target``, it must hold that model's tokens."""
    try:
        raw = gzip.decompress(path.read_bytes())
    except (OSError, zlib.error) as exc:  # missing, not gzip (BadGzipFile), damaged data
        raise ArchiveError(f"{path}: cannot read a gzip archive ({exc})") from exc
    except EOFError as exc:
        raise ArchiveError(f"{path}: truncated ({exc})") from exc
    try:
        t = load(raw)
    except SafetensorError as exc:
        raise ArchiveError(f"{path}: not a safetensors payload ({exc})") from exc
    try:
        header = json.loads(_text(t["header"]))
        ids, fmt, model = header["sequence_ids"], header["format"], header["target"]
        chat = _text(t["chat_attempts"])
        tokens, cu_t, plen_t = t["tokens"], t["cu_tokens"], t["prompt_len"]
        if tokens.dim() != 1 or cu_t.dim() != 1 or plen_t.dim() != 1:
            raise TypeError("tokens, cu_tokens and prompt_len must be 1-D")
        if (tokens.dtype, cu_t.dtype, plen_t.dtype) != (torch.int32, torch.int64, torch.int32):
            raise TypeError("tokens and prompt_len must be int32, cu_tokens int64")
        cu, plen = cu_t.tolist(), plen_t.tolist()
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise ArchiveError(f"{path}: malformed ({exc!r})") from exc
    if fmt != ARCHIVE_FORMAT:
        raise ArchiveError(f"{path}: format {fmt!r}, expected {ARCHIVE_FORMAT!r}")
    if target is not None and model != target:
        raise ArchiveError(f"{path}: tokens of {model!r}, not of {target!r}")
    lengths = [b - a for a, b in itertools.pairwise(cu)]
    if (
        not isinstance(ids, list)
        or len(cu) != len(ids) + 1
        or len(plen) != len(ids)
        or cu[0] != 0
        or cu[-1] != tokens.numel()
        or any(n < 2 for n in lengths)
        or any(not 0 < p < n for p, n in zip(plen, lengths, strict=True))
    ):
        raise ArchiveError(f"{path}: sequence ids, offsets and prompt lengths do not agree")
    if len(set(ids)) != len(ids):
        raise ArchiveError(f"{path}: a sequence id appears twice")
    if tokens.numel() and int(tokens.min()) < 0:
        raise ArchiveError(f"{path}: a negative token id")
    flat = tokens.tolist()
    seqs = [
        ArchivedSequence(str(sid), tuple(flat[cu[i] : cu[i + 1]]), int(plen[i]))
        for i, sid in enumerate(ids)
    ]
    return Archive(str(model), seqs, chat)


def archive_work(data_dir: Path, chat_cache: Path, path: Path, target: str) -> int:
    """Write to ``path`` the tokens of every sequence in ``data_dir``'s shards, plus those the
    archive at ``path`` already holds that the shards lack, and the chat-query attempts of
    ``chat_cache`` and of the old archive (:func:`merge_attempts`); returns the number of
    sequences."""
    old = read_archive(path, target) if path.is_file() else Archive(target, [], "")
    seqs = {s.sequence_id: s for s in old.sequences}
    for shard in sorted(data_dir.glob(SHARD_GLOB)):
        for sid, tokens, prompt_len in read_shard_tokens(shard):
            seqs[sid] = ArchivedSequence(sid, tuple(tokens), prompt_len)
    local = chat_cache.read_text(encoding="utf-8") if chat_cache.is_file() else ""
    write_archive(path, target, list(seqs.values()), merge_attempts(old.chat_attempts, local))
    return len(seqs)


def merge_attempts(*caches: str) -> str:
    """The chat-query attempts of several cache texts (JSON lines with an ``index``), one line
    per index in index order, a later text's line winning; a line that does not parse (a
    write cut short) is dropped, so the sampler draws that attempt again."""
    lines: dict[int, str] = {}
    for text in caches:
        for line in text.splitlines():
            try:
                index = json.loads(line)["index"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
            if isinstance(index, int):
                lines[index] = line
    return "".join(lines[i] + "\n" for i in sorted(lines))


@torch.no_grad()
def teacher_forced(
    model: LlamaModel,
    seqs: Sequence[ArchivedSequence],
    aux_layers: Sequence[int] = (),
    max_rows: int = 4096,
) -> list[DistilledSequence]:
    """Each sequence's features from one prefill of ``x_0..x_{T-1}`` (module docstring), packed
    ragged into forwards of at most ``max_rows`` rows (one longer sequence runs alone)."""
    out: list[DistilledSequence] = []
    group: list[ArchivedSequence] = []
    rows = 0
    for s in seqs:
        n = len(s.tokens) - 1
        if group and rows + n > max_rows:
            out += _forward_group(model, group, aux_layers, rows)
            group, rows = [], 0
        group.append(s)
        rows += n
    if group:
        out += _forward_group(model, group, aux_layers, rows)
    return out


def _forward_group(
    model: LlamaModel, group: Sequence[ArchivedSequence], aux_layers: Sequence[int], rows: int
) -> list[DistilledSequence]:
    cfg = model.config
    lengths = [len(s.tokens) - 1 for s in group]
    if max(lengths) > cfg.max_context:
        raise ArchiveError(f"a sequence of {max(lengths)} rows exceeds the target's context")
    if max(t for s in group for t in s.tokens) >= cfg.vocab_size:
        raise ArchiveError(f"a token id outside the target's vocabulary of {cfg.vocab_size}")
    pool = KVPool(cfg, rows, len(group), max(lengths), dtype=model.dtype, device=model.device)
    handles = [pool.add_request() for _ in group]
    inputs = torch.tensor(
        [t for s in group for t in s.tokens[:-1]], dtype=torch.int64, device=model.device
    )
    slots = pool.allocate(rows)
    batch = pool.attention_batch(handles, lengths, slots)
    res = model.forward(inputs, ragged_positions(batch), batch, pool.storage, aux_layers)
    hidden = res.hidden.to(torch.float16).cpu()
    aux = torch.cat(res.aux, dim=-1).to(torch.float16).cpu() if res.aux else None
    out: list[DistilledSequence] = []
    lo = 0
    for s, n in zip(group, lengths, strict=True):
        seq_aux = aux[lo : lo + n].clone() if aux is not None else None
        feats = hidden[lo : lo + n].clone()
        out.append(DistilledSequence(s.sequence_id, list(s.tokens), feats, s.prompt_len, seq_aux))
        lo += n
    return out


def restore_work(
    model: LlamaModel,
    path: Path,
    target: str,
    data_dir: Path,
    chat_cache: Path,
    aux_layers: Sequence[int] = (),
    shard_size: int = 64,
) -> int:
    """Rebuild (:func:`teacher_forced`) the archived sequences missing from ``data_dir``'s
    shards and write them as new shards, and add the archived chat-query attempts to the
    cache (:func:`merge_attempts`); returns the number of sequences rebuilt. Resumable like
    generation; shards of other aux layers are refused before any work."""
    archive = read_archive(path, target)
    data_dir.mkdir(parents=True, exist_ok=True)
    check_aux_layers(data_dir, aux_layers)
    if archive.chat_attempts:
        local = chat_cache.read_text(encoding="utf-8") if chat_cache.is_file() else ""
        chat_cache.parent.mkdir(parents=True, exist_ok=True)
        chat_cache.write_text(merge_attempts(archive.chat_attempts, local), encoding="utf-8")
    done = done_prompt_ids(data_dir)
    todo = [s for s in archive.sequences if s.sequence_id not in done]
    shard_index = next_shard_index(data_dir)
    with tqdm(total=len(todo), desc="restore features", unit="seq") as bar:
        for start in range(0, len(todo), shard_size):
            chunk = teacher_forced(model, todo[start : start + shard_size], aux_layers)
            write_shard(data_dir / f"shard_{shard_index:05d}.safetensors", chunk, aux_layers)
            shard_index += 1
            bar.update(len(chunk))
    log.info("archive_restored", sequences=len(todo), archive=str(path))
    return len(todo)
