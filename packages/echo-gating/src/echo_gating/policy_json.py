"""Strict, schema-versioned JSON for :class:`~echo_gating.policy.GatePolicy`.

Document (schema ``echo-gating/gate-policy``, ``schema_version`` 1; every field required, no
others allowed; object keys of depth maps are decimal depths >= 1)::

    {"schema": "echo-gating/gate-policy", "schema_version": 1,
     "version": "sha256:3f2a...", "mode": "sparse", "max_depth": 8,
     "thresholds": {"2": 0.41, "4": 0.18},
     "acceptance_maps": {"depths": [{"depth": 1, "edges": [-1.2], "values": [0.2, 0.8],
                                     "counts": [300, 700]}, ...]} | null,
     "gate_maps": {... same shape ...} | null,
     "reference": {"1": {"count": 1000, "accepted": 700, "auc": 0.93}, ...},
     "calibrated_for": {"target": "SmolLM2-135M", "drafter": "eagle-4m", "temperature": "0"}}

``"signal"`` is the one optional field: written only when it is not ``"layer_confidence"`` (so
older documents and their digests stay valid), read back with that default.

Every violation raises :class:`CalibrationError` naming the field and the value, e.g.
``thresholds["2"] is nan``, ``missing field 'mode'``, ``depth 0 in reference``. The content hash
``policy_digest`` (sha256 over the canonical document with an empty version) is the default
version label, so two calibrations that agree byte for byte share a version.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from echo_gating.errors import CalibrationError
from echo_gating.maps import AcceptanceMaps
from echo_gating.policy import DepthStats, GateMode, GatePolicy
from echo_gating.signals import DEFAULT_SIGNAL

SCHEMA = "echo-gating/gate-policy"
SCHEMA_VERSION = 1
_FIELDS = (
    "schema",
    "schema_version",
    "version",
    "mode",
    "max_depth",
    "thresholds",
    "acceptance_maps",
    "gate_maps",
    "reference",
    "calibrated_for",
)
_OPTIONAL = ("signal",)
_DEPTH_KEY = re.compile(r"-?[0-9]+")


def policy_to_dict(policy: GatePolicy) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "version": policy.version,
        "mode": policy.mode.value,
        "max_depth": policy.max_depth,
        "thresholds": {str(d): t for d, t in policy.thresholds.items()},
        "acceptance_maps": None
        if policy.acceptance_maps is None
        else policy.acceptance_maps.to_dict(),
        "gate_maps": None if policy.gate_maps is None else policy.gate_maps.to_dict(),
        "reference": {
            str(d): {"count": s.count, "accepted": s.accepted, "auc": s.auc}
            for d, s in policy.reference.items()
        },
        "calibrated_for": dict(policy.calibrated_for),
    }
    if policy.signal != DEFAULT_SIGNAL:
        doc["signal"] = policy.signal
    return doc


def policy_to_json(policy: GatePolicy) -> str:
    try:
        return json.dumps(policy_to_dict(policy), indent=2, allow_nan=False) + "\n"
    except ValueError as exc:  # a NaN slipped into a map or statistic
        raise CalibrationError(f"policy {policy.version!r} holds a non-finite number") from exc


def policy_digest(policy: GatePolicy) -> str:
    """``sha256:<16 hex>`` over the canonical document with the version left empty."""
    doc = policy_to_dict(policy)
    doc["version"] = ""
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def policy_from_json(text: str) -> GatePolicy:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"gate policy is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CalibrationError(f"gate policy must be a JSON object, got {type(doc).__name__}")
    missing = [f for f in _FIELDS if f not in doc]
    if missing:
        raise CalibrationError(f"gate policy: missing field {missing[0]!r}")
    unknown = sorted(set(doc) - set(_FIELDS) - set(_OPTIONAL))
    if unknown:
        raise CalibrationError(f"gate policy: unknown field {unknown[0]!r}")
    if doc["schema"] != SCHEMA:
        raise CalibrationError(f"gate policy: schema is {doc['schema']!r}, expected {SCHEMA!r}")
    if doc["schema_version"] != SCHEMA_VERSION:
        raise CalibrationError(
            f"gate policy: unsupported schema_version {doc['schema_version']!r} "
            f"(this build reads {SCHEMA_VERSION})"
        )
    try:
        mode = GateMode(doc["mode"])
    except ValueError as exc:
        modes = [m.value for m in GateMode]
        raise CalibrationError(f"gate policy: mode {doc['mode']!r} is not one of {modes}") from exc
    if not isinstance(doc["version"], str):
        raise CalibrationError(f"gate policy: version must be a string, got {doc['version']!r}")
    if isinstance(doc["max_depth"], bool) or not isinstance(doc["max_depth"], int):
        raise CalibrationError(
            f"gate policy: max_depth must be an integer, got {doc['max_depth']!r}"
        )
    thresholds = {
        d: _number(v, f"thresholds[{d}]") for d, v in _depth_map(doc["thresholds"], "thresholds")
    }
    for d, t in thresholds.items():
        if not math.isfinite(t):
            raise CalibrationError(f"gate policy: thresholds[{d}] is {t}; must be finite in [0, 1]")
    reference = {d: _stats(v, d) for d, v in _depth_map(doc["reference"], "reference")}
    calibrated_for = doc["calibrated_for"]
    if not isinstance(calibrated_for, dict) or not all(
        isinstance(v, str) for v in calibrated_for.values()
    ):
        raise CalibrationError("gate policy: calibrated_for must map strings to strings")
    signal = doc.get("signal", DEFAULT_SIGNAL)
    if not isinstance(signal, str):
        raise CalibrationError(f"gate policy: signal must be a string, got {signal!r}")
    return GatePolicy(
        version=doc["version"],
        mode=mode,
        thresholds=thresholds,
        acceptance_maps=_maps(doc["acceptance_maps"], "acceptance_maps"),
        max_depth=doc["max_depth"],
        gate_maps=_maps(doc["gate_maps"], "gate_maps"),
        reference=reference,
        calibrated_for=calibrated_for,
        signal=signal,
    )


def _depth_map(obj: object, name: str) -> list[tuple[int, Any]]:
    if not isinstance(obj, dict):
        raise CalibrationError(f"gate policy: {name} must be an object keyed by depth")
    out: list[tuple[int, Any]] = []
    for key, value in obj.items():
        if not _DEPTH_KEY.fullmatch(key):
            raise CalibrationError(f"gate policy: {name} key {key!r} is not a depth")
        if int(key) < 1:
            raise CalibrationError(f"gate policy: depth {int(key)} in {name}; depths start at 1")
        out.append((int(key), value))
    return out


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalibrationError(f"gate policy: {name} must be a number, got {value!r}")
    return float(value)


def _stats(value: object, depth: int) -> DepthStats:
    if not isinstance(value, dict) or set(value) != {"count", "accepted", "auc"}:
        raise CalibrationError(
            f"gate policy: reference[{depth}] must have exactly count, accepted, auc"
        )
    count, accepted, auc = value["count"], value["accepted"], value["auc"]
    for name, v in (("count", count), ("accepted", accepted)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise CalibrationError(
                f"gate policy: reference[{depth}].{name} must be an int, got {v!r}"
            )
        if v < 0:
            raise CalibrationError(f"gate policy: reference[{depth}].{name} is negative ({v})")
    auc_value = None if auc is None else _number(auc, f"reference[{depth}].auc")
    if auc_value is not None and not math.isfinite(auc_value):
        raise CalibrationError(f"gate policy: reference[{depth}].auc is {auc_value}")
    return DepthStats(count=count, accepted=accepted, auc=auc_value)


def _maps(value: object, name: str) -> AcceptanceMaps | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise CalibrationError(f"gate policy: {name} must be an object or null")
    try:
        return AcceptanceMaps.from_dict(value)
    except CalibrationError as exc:
        raise CalibrationError(f"gate policy: {name}: {exc}") from exc
