"""Warm-up records: round trip, grouping into gate samples, and every corrupt-file error."""

from __future__ import annotations

import json
import math
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from echo_core.random_trees import random_tree_batch
from echo_core.tree import make_tree
from echo_gating.errors import CalibrationError
from echo_gating.record_file import MAGIC, decode_records, encode_records
from echo_gating.records import RECORD_COLUMNS, RecordSet, RecordWriter, gate_samples


def small_records() -> RecordSet:
    return RecordSet(
        request_id=torch.tensor([7, 7, 7, 9]),
        step=torch.tensor([0, 0, 0, 3]),
        depth=torch.tensor([1, 1, 2, 1]),
        path_logprob=torch.log(torch.tensor([0.7, 0.2, 0.35, 0.9])),
        draft_logprob=torch.log(torch.tensor([0.7, 0.2, 0.5, 0.9])),
        layer_confidence=torch.tensor([0.7, 0.7, 0.35, 0.9]),
        accepted=torch.tensor([True, False, False, True]),
        extra={"draft_entropy": torch.tensor([0.5, 0.5, 1.2, 0.1])},
        meta={"target": "smollm2-135m", "drafter": "eagle-4m"},
    )


def required(records: RecordSet) -> dict[str, Any]:
    """The required columns by name (typed Any so they can be spread into RecordSet)."""
    return {name: getattr(records, name) for name in RECORD_COLUMNS}


def assert_same(a: RecordSet, b: RecordSet) -> None:
    assert a.meta == b.meta
    assert set(a.extra) == set(b.extra)
    for name, col in a.columns().items():
        assert torch.equal(col, b.columns()[name]), name


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    records = small_records()
    records.save(tmp_path / "warmup.echorec")
    assert_same(RecordSet.load(tmp_path / "warmup.echorec"), records)
    empty = records.select(torch.zeros(4, dtype=torch.bool))
    assert len(empty) == 0
    assert_same(decode_records(encode_records(empty)), empty)


def test_gate_samples_group_per_request_step_and_depth() -> None:
    samples = gate_samples(small_records())
    assert samples.depth.tolist() == [1, 2, 1]
    torch.testing.assert_close(samples.confidence, torch.tensor([0.7, 0.35, 0.9]))
    assert samples.accepted.tolist() == [True, False, True]
    assert len(gate_samples(small_records().select(torch.zeros(4, dtype=torch.bool)))) == 0


def test_writer_logs_pools_and_concatenates() -> None:
    g = torch.Generator().manual_seed(0)
    writer = RecordWriter(meta={"target": "t"})
    total = 0
    for step in range(3):
        pool = random_tree_batch(g, 3, 6)
        accepted = torch.rand(pool.num_nodes, generator=g) < 0.3
        writer.append_pool(pool, accepted, torch.tensor([10, 11, 12]), torch.full((3,), step))
        total += pool.num_nodes
    records = writer.finish()
    assert len(records) == len(writer) == total
    assert records.meta == {"target": "t"}
    assert set(records.step.tolist()) <= {0, 1, 2}
    assert bool((records.layer_confidence >= records.path_logprob.exp() - 1e-6).all())


def test_writer_rejects_mismatched_shapes() -> None:
    pool = make_tree([[(1, -1, -0.1)]])
    writer = RecordWriter()
    with pytest.raises(CalibrationError, match="accepted must be"):
        writer.append_pool(
            pool, torch.ones(2, dtype=torch.bool), torch.tensor([0]), torch.tensor([0])
        )
    with pytest.raises(CalibrationError, match="step must be"):
        writer.append_pool(
            pool, torch.ones(1, dtype=torch.bool), torch.tensor([0]), torch.tensor(0)
        )
    with pytest.raises(CalibrationError, match="no records"):
        writer.finish()


def test_concat_requires_matching_columns_and_meta() -> None:
    a = small_records()
    assert len(RecordSet.concat([a, a])) == 8
    b = RecordSet(**required(a), meta=a.meta)
    with pytest.raises(CalibrationError, match="record sets disagree"):
        RecordSet.concat([a, b])
    with pytest.raises(CalibrationError, match="zero record sets"):
        RecordSet.concat([])


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("depth", torch.tensor([1, 0, 2, 1]), "record 1: depth = 0"),
        ("path_logprob", torch.tensor([-0.1, 0.5, -1.0, -0.1]), "path_logprob = 0.5"),
        ("path_logprob", torch.tensor([-0.1, math.nan, -1.0, -0.1]), "path_logprob = nan"),
        ("layer_confidence", torch.tensor([0.5, 1.5, 0.5, 0.5]), "must lie in"),
        ("depth", torch.tensor([1.0, 1.0, 2.0, 1.0]), "dtype torch.float32, expected torch.int64"),
        ("accepted", torch.tensor([True, False]), r"must be a \[n=4\] tensor"),
    ],
)
def test_invalid_values_are_rejected(column: str, value: torch.Tensor, message: str) -> None:
    cols = required(small_records())
    cols[column] = value
    with pytest.raises(CalibrationError, match=message):
        RecordSet(**cols)


def test_bad_extra_names_and_meta() -> None:
    cols = required(small_records())
    with pytest.raises(CalibrationError, match="lower_snake_case"):
        RecordSet(**cols, extra={"Bad Name": torch.zeros(4)})
    with pytest.raises(CalibrationError, match="meta must map strings"):
        RecordSet(**cols, meta={"k": 1})  # type: ignore[dict-item]  # deliberately invalid


def build_file(header: object, payload: bytes, version: int = 1) -> bytes:
    head = json.dumps(header).encode()
    return struct.pack("<8sII", MAGIC, version, len(head)) + head + payload


def pack(cols: list[tuple[str, str, torch.Tensor]], **header_changes: object) -> bytes:
    """A well-formed file holding exactly ``cols`` (name, dtype name, tensor)."""
    payload = b"".join(bytes(t.contiguous().untyped_storage()) for _, _, t in cols)
    header: dict[str, object] = {
        "num_records": int(cols[0][2].numel()) if cols else 0,
        "columns": [{"name": name, "dtype": dtype} for name, dtype, _ in cols],
        "meta": {},
        "payload_bytes": len(payload),
        "crc32": zlib.crc32(payload),
    }
    header.update(header_changes)
    return build_file(header, payload)


def valid_columns() -> list[tuple[str, str, torch.Tensor]]:
    names = {torch.int64: "int64", torch.float32: "float32", torch.bool: "bool"}
    return [(k, names[v.dtype], v) for k, v in small_records().columns().items()]


def replaced(name: str, dtype: str, value: torch.Tensor) -> list[tuple[str, str, torch.Tensor]]:
    return [(n, dtype, value) if n == name else (n, d, t) for n, d, t in valid_columns()]


def corrupt_cases() -> list[tuple[str, bytes, str]]:
    blob = encode_records(small_records())
    (head_len,) = struct.unpack_from("<I", blob, 12)
    flipped = bytearray(blob)
    flipped[-3] ^= 0xFF
    cols = valid_columns()
    return [
        ("short prefix", blob[:10], "shorter than the prefix"),
        ("bad magic", b"NOTECHO!" + blob[8:], "not an ECHO record file"),
        ("wrong version", blob[:8] + struct.pack("<I", 9) + blob[12:], "format version 9"),
        ("truncated header", blob[: 16 + head_len // 2], "truncated header"),
        ("corrupt header", blob[:16] + b"}" + blob[17:], "corrupt header"),
        ("truncated payload", blob[:-5], "truncated payload: expected"),
        ("trailing bytes", blob + b"xx", "trailing bytes after payload"),
        ("flipped byte", bytes(flipped), "checksum mismatch"),
        ("header is a list", build_file([], b""), "header must be a JSON object"),
        ("missing count", pack(cols, num_records=None), "num_records must be a non-negative"),
        ("negative count", pack(cols, num_records=-1), "num_records must be a non-negative"),
        ("missing column", pack([c for c in cols if c[0] != "accepted"]), "column 'accepted'"),
        (
            "unknown column",
            pack([*cols, ("bogus", "int64", torch.zeros(4, dtype=torch.int64))]),
            "unknown column 'bogus'",
        ),
        (
            "unknown dtype",
            pack(cols, columns=[{"name": "depth", "dtype": "float16"}]),
            "unknown dtype",
        ),
        ("duplicate column", pack([*cols, cols[2]]), "duplicate column 'depth'"),
        ("malformed column", pack(cols, columns=[7]), "malformed column entry"),
        ("bad meta", pack(cols, meta={"a": 1}), "meta must map strings"),
        ("count too large", pack(cols, num_records=5), "header inconsistent"),
        ("count too small", pack(cols, num_records=3), "header inconsistent"),
        (
            "bool bytes",
            pack(replaced("accepted", "bool", torch.tensor([0, 2, 1, 0], dtype=torch.uint8))),
            "bytes other than 0/1",
        ),
        (
            "wrong dtype",
            pack(replaced("path_logprob", "int64", torch.zeros(4, dtype=torch.int64))),
            "'path_logprob' has dtype torch.int64",
        ),
        (
            "invalid value",
            pack(replaced("depth", "int64", torch.tensor([1, 0, 2, 1]))),
            "record 1: depth = 0",
        ),
    ]


@pytest.mark.parametrize(
    ("name", "blob", "message"), corrupt_cases(), ids=[c[0] for c in corrupt_cases()]
)
def test_corrupt_files_name_the_problem(
    tmp_path: Path, name: str, blob: bytes, message: str
) -> None:
    path = tmp_path / f"{name.replace(' ', '_')}.echorec"
    path.write_bytes(blob)
    with pytest.raises(CalibrationError, match=message) as info:
        RecordSet.load(path)
    assert str(path) in str(info.value)


def test_views_of_larger_tensors_store_only_their_own_elements() -> None:
    base = small_records()
    big: dict[str, Any] = {k: torch.cat([v, v, v]) for k, v in required(base).items()}
    view = RecordSet(**{k: v[4:8] for k, v in big.items()})
    blob = encode_records(view)
    assert len(blob) < len(encode_records(RecordSet(**big)))
    assert_same(decode_records(blob), view)
