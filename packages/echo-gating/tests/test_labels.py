"""Gate labels: reached (accepted length >= d), next (>= d + 1) and conditional (next | reached)."""

from __future__ import annotations

import pytest
import torch

from echo_gating.calibrate import CalibrationConfig, calibrate
from echo_gating.errors import CalibrationError
from echo_gating.records import GateSamples, gate_samples
from echo_gating.testing import SyntheticSpec, synthetic_records


def _samples() -> GateSamples:
    # two (request, step) pairs drafted to depth 3: accepted lengths 2 and 0
    return GateSamples(
        depth=torch.tensor([1, 2, 3, 1, 2, 3]),
        confidence=torch.tensor([0.9, 0.8, 0.3, 0.2, 0.1, 0.1]),
        accepted=torch.tensor([True, True, False, False, False, False]),
        request_id=torch.tensor([7, 7, 7, 8, 8, 8]),
        step=torch.tensor([0, 0, 0, 0, 0, 0]),
    )


def test_next_labels_are_shifted_by_one_depth_and_drop_the_deepest() -> None:
    nxt = _samples().relabelled("next")
    assert nxt.depth.tolist() == [1, 2, 1, 2]
    assert nxt.accepted.tolist() == [True, False, False, False]  # L = 2: >= 2 yes, >= 3 no


def test_conditional_labels_keep_only_requests_that_reached_the_depth() -> None:
    cond = _samples().relabelled("conditional")
    assert cond.depth.tolist() == [1, 2]
    assert cond.accepted.tolist() == [True, False]
    assert _samples().relabelled("reached") is not None


def test_relabelling_needs_ids_and_a_known_rule() -> None:
    s = _samples()
    with pytest.raises(CalibrationError, match="unknown gate label rule"):
        s.relabelled("sometimes")
    bare = GateSamples(s.depth, s.confidence, s.accepted)
    with pytest.raises(CalibrationError, match="request ids"):
        bare.relabelled("next")
    with pytest.raises(CalibrationError, match="label_rule"):
        CalibrationConfig(label_rule="sometimes")


def test_gate_samples_carry_request_and_step_and_calibration_uses_the_rule() -> None:
    records = synthetic_records(SyntheticSpec(), torch.Generator().manual_seed(0), 200, 2)
    samples = gate_samples(records)
    assert samples.request_id is not None
    assert samples.step is not None
    nxt = samples.relabelled("next")
    assert 0 < len(nxt) < len(samples)
    assert int(nxt.accepted.sum()) < int(samples.accepted.sum())  # L >= d+1 is rarer
    reached = calibrate(records, CalibrationConfig(label="a"))
    shifted = calibrate(records, CalibrationConfig(label="b", label_rule="next"))
    assert reached.reference != shifted.reference  # the statistics follow the labels
