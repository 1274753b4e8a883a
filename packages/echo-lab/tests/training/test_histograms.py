"""The layer-wise confidence figures (training/calibration.py) render from gate samples."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from echo_gating.layerwise import LABEL_RULES
from echo_gating.records import gate_samples
from echo_gating.testing import SyntheticSpec, synthetic_records
from echo_lab.training.calibration import (
    LABEL_TITLES,
    confidence_histograms,
    layerwise_histograms,
)


def test_both_figures_write_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the plots extra
    records = synthetic_records(SyntheticSpec(), torch.Generator().manual_seed(0), 50, 2)
    layerwise_histograms(gate_samples(records), tmp_path / "lw.png", max_depth=3)
    confidence_histograms(records, tmp_path / "conf.png", max_depth=4)
    for name in ("lw.png", "conf.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_label_rule_has_a_title() -> None:
    assert set(LABEL_TITLES) == set(LABEL_RULES)
