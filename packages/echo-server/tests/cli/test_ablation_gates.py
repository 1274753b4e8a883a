"""The paper's two ablations run with gates calibrated from the same warm-up records as ECHO's
sparse gate (acceptance maps included), never with one hand-picked threshold in disguise."""

from __future__ import annotations

from pathlib import Path

import pytest

from echo_gating.policy import GateMode, GatePolicy
from echo_server.assets import DEFAULT_GATE, MIXTURE_GATE, ablation_gate
from echo_server.cli.options import FIXED_THRESHOLD, gate_for


@pytest.mark.parametrize("shipped", [DEFAULT_GATE, MIXTURE_GATE], ids=["eagle", "eagle+ngram"])
def test_shipped_gates_have_calibrated_ablations_from_the_same_records(shipped: Path) -> None:
    sparse = GatePolicy.load(shipped)
    dense, fixed = gate_for("echo_dense", shipped, 8), gate_for("echo_fixed", shipped, 8)
    assert dense is not None
    assert fixed is not None
    assert (sparse.mode, dense.mode, fixed.mode) == (
        GateMode.SPARSE,
        GateMode.DENSE,
        GateMode.FIXED,
    )
    for ablation in (dense, fixed):
        assert ablation.calibrated_for == sparse.calibrated_for
        assert ablation.acceptance_maps == sparse.acceptance_maps  # same records, same maps
        assert ablation.reference == sparse.reference  # same gate samples per depth
    assert set(dense.thresholds) == set(range(1, dense.max_depth + 1))
    assert len(set(fixed.thresholds.values())) == 1
    assert dense.thresholds != fixed.thresholds
    assert set(fixed.thresholds.values()) != {FIXED_THRESHOLD}


def test_an_ablation_sibling_is_preferred_and_a_matching_file_is_used_as_is(
    tmp_path: Path,
) -> None:
    sparse_file = tmp_path / "x.gate.json"
    GatePolicy.sparse({2: 0.4}, 3).save(sparse_file)
    sibling = ablation_gate(sparse_file, "dense")
    assert sibling == tmp_path / "x.dense.gate.json"
    GatePolicy.dense({1: 0.1, 2: 0.2}).save(sibling)
    dense = gate_for("echo_dense", sparse_file, 2)
    assert dense is not None
    assert dense.thresholds == {1: 0.1, 2: 0.2}
    assert gate_for("echo_dense", sibling, 2) == dense
    sparse = gate_for("echo", sparse_file, 2)
    assert sparse is not None
    assert sparse.mode is GateMode.SPARSE


def test_without_a_calibrated_ablation_the_default_is_used(tmp_path: Path) -> None:
    sparse_file = tmp_path / "y.gate.json"
    GatePolicy.sparse({2: 0.4}, 3).save(sparse_file)
    fixed = gate_for("echo_fixed", sparse_file, 3)
    assert fixed is not None
    assert fixed.thresholds == dict.fromkeys(range(1, 4), FIXED_THRESHOLD)
    assert gate_for("echo_dense", None, 2) == GatePolicy.dense(
        {1: FIXED_THRESHOLD, 2: FIXED_THRESHOLD}
    )
