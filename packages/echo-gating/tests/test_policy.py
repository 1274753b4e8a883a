"""GatePolicy: gate() semantics per mode, JSON round trip, and every malformed document."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from echo_gating.errors import CalibrationError, GatingError
from echo_gating.maps import AcceptanceMaps, DepthMap
from echo_gating.policy import DepthStats, GateMode, GatePolicy
from echo_gating.policy_json import policy_digest, policy_to_dict

CONF = torch.tensor([0.9, 0.4, 0.3999, 0.0])


def full_policy() -> GatePolicy:
    maps = AcceptanceMaps((DepthMap((-1.0,), (0.1, 0.7), (30, 70)), DepthMap((), (0.4,), (50,))))
    return GatePolicy(
        version="v1",
        mode=GateMode.SPARSE,
        thresholds={2: 0.4, 4: 0.25},
        acceptance_maps=maps,
        max_depth=6,
        gate_maps=maps,
        reference={1: DepthStats(100, 70, 0.93), 2: DepthStats(100, 50, None)},
        calibrated_for={"target": "smollm2-135m", "drafter": "eagle-4m", "temperature": "0"},
    )


def test_sparse_gates_only_at_checkpoints() -> None:
    p = GatePolicy.sparse({2: 0.4}, max_depth=6)
    assert p.gate(2, CONF).tolist() == [True, True, False, False]
    assert p.gate(3, CONF).all()
    assert p.gate(9, CONF).all()
    assert p.is_checkpoint(2)
    assert not p.is_checkpoint(3)
    assert p.checkpoints == (2,)


def test_dense_gates_every_depth_with_its_own_threshold() -> None:
    p = GatePolicy.dense({1: 0.1, 2: 0.5, 3: 0.95})
    assert p.max_depth == 3
    assert p.gate(1, CONF).tolist() == [True, True, True, False]
    assert p.gate(2, CONF).tolist() == [True, False, False, False]
    assert p.gate(3, CONF).tolist() == [False, False, False, False]
    assert all(p.is_checkpoint(d) for d in (1, 2, 3))


def test_fixed_uses_one_threshold_everywhere() -> None:
    p = GatePolicy.fixed(0.4, max_depth=4)
    for d in range(1, 5):
        assert p.gate(d, CONF).tolist() == [True, True, False, False]
    assert p.thresholds == dict.fromkeys(range(1, 5), 0.4)


def test_none_never_gates() -> None:
    p = GatePolicy.none(max_depth=8)
    assert p.gate(1, CONF).all()
    assert p.gate(5, torch.zeros(2)).all()
    assert not p.is_checkpoint(1)
    assert p.checkpoints == ()


def test_gate_input_checks() -> None:
    p = GatePolicy.none()
    with pytest.raises(GatingError, match="depth must be >= 1"):
        p.gate(0, CONF)
    with pytest.raises(GatingError, match=r"\[B\] float"):
        p.gate(1, torch.zeros(2, 2))
    assert p.gate(1, torch.zeros(0)).shape == (0,)


def test_json_round_trip_and_file(tmp_path: Path) -> None:
    p = full_policy()
    text = p.to_json()
    assert GatePolicy.from_json(text) == p
    assert json.loads(text)["thresholds"] == {"2": 0.4, "4": 0.25}
    p.save(tmp_path / "gate.json")
    loaded = GatePolicy.load(tmp_path / "gate.json")
    assert loaded == p
    assert hash(loaded) == hash(p)
    for q in (GatePolicy.none(), GatePolicy.fixed(0.3, 5), GatePolicy.dense({1: 0.2, 2: 0.3})):
        assert GatePolicy.from_json(q.to_json()) == q


def test_digest_ignores_the_version_label() -> None:
    p = full_policy()
    relabelled = GatePolicy.from_json(p.to_json().replace('"v1"', '"other"'))
    assert policy_digest(p) == policy_digest(relabelled)
    assert policy_digest(p) != policy_digest(GatePolicy.sparse({2: 0.41}, max_depth=6))


def mutate(path: tuple[str | int, ...], value: Any, delete: bool = False) -> str:
    doc = policy_to_dict(full_policy())
    node: Any = doc
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (mutate(("mode",), None, delete=True), "missing field 'mode'"),
        (mutate(("thresholds",), None, delete=True), "missing field 'thresholds'"),
        (mutate(("extra",), 1), "unknown field 'extra'"),
        (mutate(("schema",), "other"), "schema is 'other'"),
        (mutate(("schema_version",), 2), "unsupported schema_version 2"),
        (mutate(("mode",), "greedy"), "mode 'greedy' is not one of"),
        (mutate(("version",), 3), "version must be a string"),
        (mutate(("version",), ""), "non-empty string"),
        (mutate(("max_depth",), 0), "max_depth must be >= 1"),
        (mutate(("max_depth",), "8"), "max_depth must be an integer"),
        (mutate(("thresholds", "2"), float("nan")), r"thresholds\[2\] is nan"),
        (mutate(("thresholds", "2"), float("inf")), r"thresholds\[2\] is inf"),
        (mutate(("thresholds", "2"), 1.5), "threshold at depth 2 is 1.5"),
        (mutate(("thresholds", "2"), "high"), "must be a number"),
        (mutate(("thresholds", "0"), 0.5), "depth 0 in thresholds"),
        (mutate(("thresholds", "x"), 0.5), "key 'x' is not a depth"),
        (mutate(("thresholds", "7"), 0.5), "threshold at depth 7: depths run from 1 to"),
        (mutate(("reference", "1", "count"), -5), r"reference\[1\].count is negative"),
        (mutate(("reference", "1", "accepted"), 101), "accepted <= count"),
        (
            mutate(("reference", "0"), {"count": 1, "accepted": 0, "auc": None}),
            "depth 0 in reference",
        ),
        (mutate(("reference", "1", "auc"), 1.5), "AUC must lie in"),
        (mutate(("reference", "1", "count"), None, delete=True), "exactly count, accepted, auc"),
        (
            mutate(("acceptance_maps", "depths", 0, "values"), [0.9, 0.1]),
            "acceptance_maps: .*non-decreasing",
        ),
        (
            mutate(("gate_maps", "depths", 0, "counts"), [1.5, 2]),
            "gate_maps: .*counts must be integers",
        ),
        (mutate(("acceptance_maps",), [1]), "must be an object or null"),
        (mutate(("calibrated_for",), {"target": 1}), "calibrated_for must map strings"),
    ],
)
def test_malformed_documents_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        GatePolicy.from_json(text)


def test_mode_consistency_is_enforced() -> None:
    with pytest.raises(CalibrationError, match="mode none takes no thresholds"):
        GatePolicy("x", GateMode.NONE, {1: 0.5}, None, 3)
    with pytest.raises(CalibrationError, match=r"every depth 1\.\.3"):
        GatePolicy("x", GateMode.DENSE, {1: 0.5, 3: 0.5}, None, 3)
    with pytest.raises(CalibrationError, match="mode fixed needs one threshold"):
        GatePolicy("x", GateMode.FIXED, {1: 0.5, 2: 0.6}, None, 2)
    with pytest.raises(CalibrationError, match="at least one threshold"):
        GatePolicy.dense({})


def test_load_rejects_binary_garbage(tmp_path: Path) -> None:
    path = tmp_path / "gate.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CalibrationError, match="not UTF-8"):
        GatePolicy.load(path)


def test_gate_signal_travels_in_json_only_when_not_the_default() -> None:
    plain = GatePolicy.sparse({2: 0.4}, max_depth=4)
    assert "signal" not in policy_to_dict(plain)  # older documents and digests stay valid
    margin = dataclasses.replace(plain, signal="sibling_margin")
    doc = policy_to_dict(margin)
    assert doc["signal"] == "sibling_margin"
    back = GatePolicy.from_json(margin.to_json())
    assert back.signal == "sibling_margin"
    assert back == margin
    assert policy_digest(margin) != policy_digest(plain)
    with pytest.raises(CalibrationError, match="gate signal 'entropy' is not one of"):
        GatePolicy.from_json(json.dumps({**doc, "signal": "entropy"}))
    with pytest.raises(CalibrationError, match="signal must be a string"):
        GatePolicy.from_json(json.dumps({**doc, "signal": 3}))
