"""End-to-end calibration on synthetic warm-up data with known answers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_gating.calibrate import (
    CalibrationConfig,
    calibrate,
    calibrate_gates,
    calibration_report,
)
from echo_gating.errors import CalibrationError
from echo_gating.policy import GateMode, GatePolicy
from echo_gating.records import RecordSet, gate_samples
from echo_gating.report import CalibrationReport
from echo_gating.testing import SyntheticSpec, synthetic_records

SPEC = SyntheticSpec()  # separable at depths 1-3, merging from depth 4 on
COST = 0.5


@pytest.fixture(scope="module")
def records() -> RecordSet:
    return synthetic_records(SPEC, torch.Generator().manual_seed(11), 400, 10)


@pytest.fixture(scope="module")
def report(records: RecordSet) -> CalibrationReport:
    return calibration_report(records, CalibrationConfig(cost_ratio=COST))


def test_checkpoints_are_the_separable_depths(report: CalibrationReport) -> None:
    assert report.checkpoints == (1, 2, 3)
    assert report.policy.mode is GateMode.SPARSE
    for d in range(1, SPEC.max_depth + 1):
        assert report.depth(d).gate_auc == pytest.approx(SPEC.true_auc(d), abs=0.03)


def test_thresholds_recover_the_known_optimum(report: CalibrationReport) -> None:
    for d, tau in report.thresholds.items():
        optimum = SPEC.optimal_threshold(d, COST)
        gains = SPEC.expected_utility(d, torch.tensor([tau, optimum]), COST)
        assert float(gains[0]) >= float(gains[1]) - 0.005, (d, tau, optimum)
        assert tau == pytest.approx(optimum, abs=0.1)


def test_policy_carries_maps_reference_and_identity(report: CalibrationReport) -> None:
    p = report.policy
    assert p.version.startswith("sha256:")
    assert p.max_depth == SPEC.max_depth
    assert p.calibrated_for == {"drafter": "synthetic", "target": "synthetic"}
    assert set(p.reference) == set(range(1, 9))
    assert p.reference[1].accept_rate == pytest.approx(SPEC.prior(1), abs=0.03)
    assert p.acceptance_maps is not None
    assert p.gate_maps is not None
    assert GatePolicy.from_json(p.to_json()) == p


def test_report_renders_markdown(report: CalibrationReport) -> None:
    text = report.to_markdown()
    assert "Checkpoints 1, 2, 3" in text
    assert "| 4 | 4000 |" in text
    assert "path_logprob AUC" in text
    assert text.count("\n|") == 2 + SPEC.max_depth


@pytest.mark.parametrize("mode", list(GateMode))
def test_ablation_modes(records: RecordSet, mode: GateMode) -> None:
    p = calibrate(records, CalibrationConfig(mode=mode, label=f"ablation-{mode.value}"))
    assert p.mode is mode
    assert p.version == f"ablation-{mode.value}"
    expected_depths = {
        GateMode.SPARSE: {1, 2, 3},
        GateMode.DENSE: set(range(1, 9)),
        GateMode.FIXED: set(range(1, 9)),
        GateMode.NONE: set(),
    }[mode]
    assert set(p.thresholds) == expected_depths
    if mode is GateMode.FIXED:
        assert len(set(p.thresholds.values())) == 1


def test_configuration_knobs(records: RecordSet) -> None:
    assert calibrate(records, CalibrationConfig(num_checkpoints=2)).checkpoints == (1, 2)
    assert calibrate(records, CalibrationConfig(min_depth=2)).checkpoints == (2, 3)
    assert calibrate(records, CalibrationConfig(min_gap=2)).checkpoints == (1, 3)
    fixed = calibrate(records, CalibrationConfig(mode=GateMode.FIXED, fixed_threshold=0.3))
    assert set(fixed.thresholds.values()) == {0.3}
    shallow = calibrate(records, CalibrationConfig(max_depth=4))
    assert shallow.max_depth == 4
    assert shallow.acceptance_maps is not None
    assert shallow.acceptance_maps.max_depth == 4
    youden = calibrate(records, CalibrationConfig(threshold_rule="youden"))
    assert youden.checkpoints == (1, 2, 3)
    assert youden.thresholds != calibrate(records).thresholds


def test_no_separable_depth_gives_an_empty_sparse_policy() -> None:
    merged = SyntheticSpec(separation=(0.0, 0.0), continue_prob=(0.8, 0.8))
    p = calibrate(synthetic_records(merged, torch.Generator().manual_seed(0), 300, 1))
    assert p.checkpoints == ()
    assert p.gate(1, torch.zeros(3)).all()


@settings(derandomize=True, deadline=None, max_examples=5)
@given(seed=st.integers(0, 2**31 - 1))
def test_calibration_is_invariant_to_record_order(seed: int) -> None:
    recs = synthetic_records(SPEC, torch.Generator().manual_seed(5), 60, 4)
    perm = torch.randperm(len(recs), generator=torch.Generator().manual_seed(seed))
    shuffled = recs.select(perm)
    assert calibrate(shuffled) == calibrate(recs)


def test_gate_only_recalibration_from_samples(records: RecordSet, tmp_path: Path) -> None:
    report = calibrate_gates(gate_samples(records), CalibrationConfig(label="window"))
    assert report.checkpoints == (1, 2, 3)
    assert report.policy.acceptance_maps is None
    assert report.depth(1).nodes == 0
    assert not report.depth(1).node_auc
    records.save(tmp_path / "warmup.echorec")
    assert calibrate(RecordSet.load(tmp_path / "warmup.echorec")) == calibrate(records)


def test_invalid_input_and_configuration(records: RecordSet) -> None:
    with pytest.raises(CalibrationError, match="zero records"):
        calibrate(records.select(torch.zeros(len(records), dtype=torch.bool)))
    with pytest.raises(CalibrationError, match="cost_ratio"):
        CalibrationConfig(cost_ratio=0.0)
    with pytest.raises(CalibrationError, match="fixed_threshold"):
        CalibrationConfig(fixed_threshold=math.nan)
    with pytest.raises(CalibrationError, match="max_depth"):
        CalibrationConfig(max_depth=0)
    with pytest.raises(CalibrationError, match="min_depth"):
        CalibrationConfig(min_depth=0)
