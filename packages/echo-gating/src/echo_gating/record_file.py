"""The warm-up record file: a small binary container with a JSON header and a checksum.

Layout (all integers little-endian)::

    offset 0   8 bytes   magic  b"ECHOGREC"
    offset 8   uint32    format version (1)
    offset 12  uint32    header length H
    offset 16  H bytes   UTF-8 JSON header:
                         {"num_records": n, "columns": [{"name": ..., "dtype": ...}, ...],
                          "meta": {str: str}, "payload_bytes": P, "crc32": c}
    offset 16+H  P bytes payload: the columns back to back in header order, n items each,
                         raw little-endian (bool as one byte 0/1)

Loading checks, in order, and raises :class:`CalibrationError` naming the problem: size of the
fixed prefix, magic, version, header length, header JSON and its fields, payload length
(truncated or trailing bytes), CRC-32 of the payload, required columns and dtypes, bool bytes in
{0, 1}, then the record invariants of :class:`~echo_gating.records.RecordSet`. No pickle is
involved, so a file from an untrusted source cannot run code.

Size: 7 required columns take 41 bytes per record (about 4 MB per 100k drafted nodes).
"""

from __future__ import annotations

import ctypes
import json
import struct
import sys
import zlib
from pathlib import Path

import torch
from torch import Tensor

from echo_gating.errors import CalibrationError
from echo_gating.records import RECORD_COLUMNS, RecordSet

MAGIC = b"ECHOGREC"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")
_DTYPES: dict[str, torch.dtype] = {
    "int64": torch.int64,
    "float32": torch.float32,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def encode_records(records: RecordSet) -> bytes:
    _require_little_endian()
    cols = records.columns()
    payload = b"".join(_tensor_bytes(t) for t in cols.values())
    header = json.dumps(
        {
            "num_records": len(records),
            "columns": [{"name": k, "dtype": _NAMES[t.dtype]} for k, t in cols.items()],
            "meta": dict(records.meta),
            "payload_bytes": len(payload),
            "crc32": zlib.crc32(payload),
        },
        sort_keys=True,
    ).encode()
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)) + header + payload


def decode_records(data: bytes, source: str = "<bytes>") -> RecordSet:
    """Parse and validate a record file's bytes; ``source`` names it in error messages."""
    _require_little_endian()
    header, payload = _split(data, source)
    n, columns, meta, payload_bytes, crc = _header_fields(header, source)
    sizes = [n * torch.empty(0, dtype=dtype).element_size() for _, dtype in columns]
    if sum(sizes) != payload_bytes:
        raise CalibrationError(
            f"{source}: header inconsistent: {n} records of {len(columns)} columns need "
            f"{sum(sizes)} bytes, payload_bytes says {payload_bytes}"
        )
    if len(payload) != payload_bytes:
        kind = (
            "truncated payload" if len(payload) < payload_bytes else "trailing bytes after payload"
        )
        raise CalibrationError(
            f"{source}: {kind}: expected {payload_bytes} bytes, found {len(payload)}"
        )
    if zlib.crc32(payload) != crc:
        raise CalibrationError(f"{source}: payload checksum mismatch (the file is corrupt)")
    tensors: dict[str, Tensor] = {}
    offset = 0
    for (name, dtype), size in zip(columns, sizes, strict=True):
        tensors[name] = _column(
            payload[offset : offset + size], dtype, f"{source}: column {name!r}"
        )
        offset += size
    for name, dtype in RECORD_COLUMNS.items():
        if name not in tensors:
            raise CalibrationError(f"{source}: missing column {name!r}")
        if tensors[name].dtype != dtype:
            raise CalibrationError(
                f"{source}: column {name!r} has dtype {tensors[name].dtype}, expected {dtype}"
            )
    extra = {k.removeprefix("extra."): v for k, v in tensors.items() if k.startswith("extra.")}
    unknown = set(tensors) - set(RECORD_COLUMNS) - {f"extra.{k}" for k in extra}
    if unknown:
        raise CalibrationError(f"{source}: unknown column {sorted(unknown)[0]!r}")
    try:
        return RecordSet(**{k: tensors[k] for k in RECORD_COLUMNS}, extra=extra, meta=meta)
    except CalibrationError as exc:
        raise CalibrationError(f"{source}: {exc}") from exc


def save_records(records: RecordSet, path: str | Path) -> None:
    Path(path).write_bytes(encode_records(records))


def load_records(path: str | Path) -> RecordSet:
    return decode_records(Path(path).read_bytes(), source=str(path))


def _split(data: bytes, source: str) -> tuple[object, bytes]:
    """Check the fixed prefix; return the parsed JSON header and the payload bytes."""
    if len(data) < _PREFIX.size:
        raise CalibrationError(f"{source}: truncated: {len(data)} bytes, shorter than the prefix")
    magic, version, header_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise CalibrationError(f"{source}: not an ECHO record file (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise CalibrationError(
            f"{source}: unsupported record format version {version} "
            f"(this build reads {FORMAT_VERSION})"
        )
    body = _PREFIX.size + header_len
    if len(data) < body:
        raise CalibrationError(
            f"{source}: truncated header ({len(data) - _PREFIX.size} of {header_len} bytes)"
        )
    try:
        header = json.loads(data[_PREFIX.size : body].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"{source}: corrupt header: {exc}") from exc
    return header, data[body:]


def _column(raw: bytes, dtype: torch.dtype, what: str) -> Tensor:
    """One column from its raw little-endian bytes (bool stored as one byte 0/1)."""
    storage = torch.uint8 if dtype == torch.bool else dtype
    if not raw:
        return torch.zeros(0, dtype=dtype)
    values = torch.frombuffer(bytearray(raw), dtype=storage)  # owns a private copy
    if dtype == torch.bool:
        if bool((values > 1).any()):
            raise CalibrationError(f"{what} holds bytes other than 0/1")
        return values.bool()
    return values


def _header_fields(
    header: object, source: str
) -> tuple[int, list[tuple[str, torch.dtype]], dict[str, str], int, int]:
    if not isinstance(header, dict):
        raise CalibrationError(f"{source}: header must be a JSON object")
    for key in ("num_records", "columns", "meta", "payload_bytes", "crc32"):
        if key not in header:
            raise CalibrationError(f"{source}: header is missing {key!r}")
    for key in ("num_records", "payload_bytes", "crc32"):
        value = header[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CalibrationError(
                f"{source}: header {key} must be a non-negative int, got {value!r}"
            )
    columns: list[tuple[str, torch.dtype]] = []
    if not isinstance(header["columns"], list):
        raise CalibrationError(f"{source}: header columns must be a list")
    for col in header["columns"]:
        if not isinstance(col, dict) or not isinstance(col.get("name"), str):
            raise CalibrationError(f"{source}: malformed column entry {col!r}")
        if col.get("dtype") not in _DTYPES:
            raise CalibrationError(
                f"{source}: column {col['name']!r} has unknown dtype {col.get('dtype')!r}"
            )
        if any(col["name"] == seen for seen, _ in columns):
            raise CalibrationError(f"{source}: duplicate column {col['name']!r}")
        columns.append((col["name"], _DTYPES[col["dtype"]]))
    meta = header["meta"]
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CalibrationError(f"{source}: header meta must map strings to strings")
    return header["num_records"], columns, meta, header["payload_bytes"], header["crc32"]


def _tensor_bytes(t: Tensor) -> bytes:
    """The raw bytes of ``t``'s elements (a CPU tensor), without numpy.

    ``bytes(t.untyped_storage())`` would copy the whole underlying storage of a view and walk it
    byte by byte in Python; reading ``numel * element_size`` bytes at ``data_ptr`` of a
    contiguous tensor is exact and fast.
    """
    flat = t.detach().cpu().contiguous()
    if flat.numel() == 0:
        return b""
    return ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size())


def _require_little_endian() -> None:
    if sys.byteorder != "little":
        raise CalibrationError("record files are little-endian; this host is big-endian")
