"""Token archives: round trip, refusal of bad files, features rebuilt by teacher forcing."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from echo_core.tolerance import float_tolerance
from echo_lab.training.archive import (
    ARCHIVE_FORMAT,
    ArchivedSequence,
    ArchiveError,
    archive_work,
    read_archive,
    restore_work,
    teacher_forced,
    write_archive,
)
from echo_lab.training.dataset import load_sequences
from echo_lab.training.selfdistill import generate_dataset, stored_aux_layers, write_shard
from echo_lab.training.testing import sequences
from echo_server.model.loader import LoadedModel
from echo_server.prompts import Prompt

SEQS = [
    ArchivedSequence("b/1", (5, 6, 7, 8), 2),
    ArchivedSequence("a/0", (1, 2, 3), 1),
    ArchivedSequence("a/0~s1", (1, 2, 9, 10, 11), 2),
]


def test_an_archive_round_trips_sorted_and_byte_stable(tmp_path: Path) -> None:
    one, two = tmp_path / "one.safetensors.gz", tmp_path / "two.safetensors.gz"
    write_archive(one, "m", SEQS, '{"index": 0}\n')
    write_archive(two, "m", list(reversed(SEQS)), '{"index": 0}\n')
    assert one.read_bytes() == two.read_bytes()
    back = read_archive(one, "m")
    assert back.target == "m"
    assert back.chat_attempts == '{"index": 0}\n'
    assert back.sequences == sorted(SEQS, key=lambda s: s.sequence_id)
    with pytest.raises(ArchiveError, match="unique"):
        write_archive(one, "m", [SEQS[0], SEQS[0]])


def _utf8(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode()), dtype=torch.uint8)


def _payload(meta: dict[str, object], tokens: list[int], cu: list[int], plen: list[int]) -> bytes:
    tensors = {
        "tokens": torch.tensor(tokens, dtype=torch.int32),
        "cu_tokens": torch.tensor(cu, dtype=torch.int64),
        "prompt_len": torch.tensor(plen, dtype=torch.int32),
        "header": _utf8(json.dumps(meta)),
        "chat_attempts": _utf8(""),
    }
    return gzip.compress(save(tensors))


def _damaged(data: bytes) -> bytes:
    """``data`` (gzip) with its deflate stream's first block header made invalid: zlib.error,
    not an OSError."""
    out = bytearray(data)
    out[10] = 0xFF  # the byte after the 10-byte gzip header: BTYPE 11 (reserved)
    return bytes(out)


GOOD_META: dict[str, object] = {"format": ARCHIVE_FORMAT, "target": "m", "sequence_ids": ["x"]}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not gzip at all", "cannot read"),
        (gzip.compress(b"\x08\x00\x00\x00\x00\x00\x00\x00{bad json"), "not a safetensors"),
        (gzip.compress(_payload(GOOD_META, [1, 2], [0, 2], [1])), "not a safetensors"),
        (_payload({**GOOD_META, "format": "other/9"}, [1, 2], [0, 2], [1]), "format"),
        (_payload({**GOOD_META, "target": "other"}, [1, 2], [0, 2], [1]), "not of 'm'"),
        (_payload({"format": ARCHIVE_FORMAT, "target": "m"}, [1, 2], [0, 2], [1]), "malformed"),
        (_payload({**GOOD_META, "sequence_ids": "x"}, [1, 2], [0, 2], [1]), "do not agree"),
        (_payload(GOOD_META, [1, 2, 3], [0, 2], [1]), "do not agree"),  # offsets short of tokens
        (_payload(GOOD_META, [1, 2], [0, 2], [2]), "do not agree"),  # no answer token
        (_payload(GOOD_META, [1, 2], [0, 2], [1, 1]), "do not agree"),  # a prompt length too many
        (
            _payload({**GOOD_META, "sequence_ids": ["x", "x"]}, [1, 2, 3, 4], [0, 2, 4], [1, 1]),
            "twice",
        ),
        (_payload(GOOD_META, [-1, 2], [0, 2], [1]), "negative"),
        (_damaged(_payload(GOOD_META, [1, 2] * 40, [0, 80], [1])), "cannot read"),
    ],
)
def test_a_bad_archive_is_refused_by_name(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "bad.safetensors.gz"
    path.write_bytes(data)
    with pytest.raises(ArchiveError, match=message):
        read_archive(path, "m")
    with pytest.raises(ArchiveError, match="cannot read"):
        read_archive(tmp_path / "missing.safetensors.gz")
    trunc = tmp_path / "truncated.safetensors.gz"
    trunc.write_bytes(_payload(GOOD_META, [1, 2], [0, 2], [1])[:-6])
    with pytest.raises(ArchiveError):
        read_archive(trunc, "m")


def test_archiving_a_work_dir_keeps_sequences_the_shards_lack(tmp_path: Path) -> None:
    data, path, chat = tmp_path / "data", tmp_path / "a.safetensors.gz", tmp_path / "chat.jsonl"
    data.mkdir()
    seqs = sequences(4, 8, 12)
    write_shard(data / "shard_00000.safetensors", seqs[:2])
    old_chat = '{"index": 0, "text": "old"}\n{"index": 1, "text": "old"}\n'
    write_archive(path, "m", [ArchivedSequence("old/0", (1, 2), 1)], old_chat)
    assert archive_work(data, chat, path, "m") == 3
    back = read_archive(path, "m")
    assert back.chat_attempts == old_chat  # no cache file in the work dir: kept
    kept = {s.sequence_id for s in back.sequences}
    assert kept == {"old/0", seqs[0].prompt_id, seqs[1].prompt_id}
    # the local cache: attempt 1 again, attempt 2 new, and a last line cut short
    chat.write_text('{"index": 2, "text": "new"}\n{"index": 1, "text": "new"}\n{"ind', "utf-8")
    write_shard(data / "shard_00003.safetensors", seqs[2:])  # a gap in the numbering
    assert archive_work(data, chat, path, "m") == 5
    assert read_archive(path, "m").chat_attempts == (
        '{"index": 0, "text": "old"}\n{"index": 1, "text": "new"}\n{"index": 2, "text": "new"}\n'
    )
    by_id = {s.sequence_id: s for s in read_archive(path, "m").sequences}
    for s in seqs:
        assert by_id[s.prompt_id] == ArchivedSequence(s.prompt_id, tuple(s.tokens), s.prompt_len)


PROMPTS = [
    Prompt("t/0", 'def mul(a, b):\n    """Return a * b."""\n', False),
    Prompt("t/1", "Name two rivers.", True),
    Prompt("t/2", "Say hello.", True),
]


def test_restored_features_equal_the_recorded_ones(smollm: LoadedModel, tmp_path: Path) -> None:
    """Generate with aux layers, archive, restore into a fresh work dir: the same sequences,
    features equal to the decode's within float32 rounding over 30 layers plus one float16
    rounding. (Not their argmax: a near tie may round either way in float16.)"""
    layers = (1, 14)
    gen, fresh = tmp_path / "gen", tmp_path / "fresh"
    generate_dataset(smollm, PROMPTS, gen / "data", max_tokens=6, aux_layers=layers)
    attempts = '{"index": 0, "ended": true, "text": "q"}\n'
    (gen / "chat.jsonl").write_text(attempts, encoding="utf-8")
    path = tmp_path / "tokens.safetensors.gz"
    name = smollm.source.name
    assert archive_work(gen / "data", gen / "chat.jsonl", path, name) == 3
    chat = fresh / "chat.jsonl"
    assert restore_work(smollm.model, path, name, fresh / "data", chat, layers, shard_size=2) == 3
    assert restore_work(smollm.model, path, name, fresh / "data", chat, layers) == 0  # resumes
    assert chat.read_text(encoding="utf-8") == attempts
    assert stored_aux_layers(fresh / "data") == layers
    other = tmp_path / "other"  # a work dir of other layers: refused before any shard is written
    restore_work(smollm.model, path, name, other / "data", chat, (1,), shard_size=2)
    with pytest.raises(ValueError, match="aux layers"):
        restore_work(smollm.model, path, name, other / "data", chat, layers)
    assert stored_aux_layers(other / "data") == (1,)
    recorded = {s.prompt_id: s for s in load_sequences(gen / "data")}
    rebuilt = {s.prompt_id: s for s in load_sequences(fresh / "data")}
    assert recorded.keys() == rebuilt.keys()
    cfg = smollm.model.config
    reduction = max(cfg.hidden_size, cfg.intermediate_size)
    for pid, ref in recorded.items():
        got = rebuilt[pid]
        assert (got.tokens, got.prompt_len) == (ref.tokens, ref.prompt_len)
        assert got.aux is not None
        assert ref.aux is not None
        for a, b in ((got.features, ref.features), (got.aux, ref.aux)):
            scale = float(b.float().abs().max())
            atol = float_tolerance(torch.float32, reduction, cfg.num_layers, scale=scale)
            atol += torch.finfo(torch.float16).eps * scale
            torch.testing.assert_close(a.float(), b.float(), rtol=0.0, atol=atol)


def test_teacher_forcing_packs_ragged_groups_alike(smollm: LoadedModel) -> None:
    """One forward per sequence or several packed into one: the same features."""
    seqs = [
        ArchivedSequence("x/0", (1, 504, 28, 16, 9, 7), 2),
        ArchivedSequence("x/1", (1, 33, 12), 1),
        ArchivedSequence("x/2", (1, 95, 7, 7, 12), 3),
    ]
    alone = teacher_forced(smollm.model, seqs, max_rows=1)
    packed = teacher_forced(smollm.model, seqs, max_rows=64)
    cfg = smollm.model.config
    for a, b in zip(alone, packed, strict=True):
        scale = float(a.features.float().abs().max())
        atol = float_tolerance(torch.float32, cfg.intermediate_size, cfg.num_layers, scale=scale)
        atol += torch.finfo(torch.float16).eps * scale
        assert a.features.shape == (len(a.tokens) - 1, cfg.hidden_size)
        torch.testing.assert_close(a.features.float(), b.features.float(), rtol=0.0, atol=atol)
