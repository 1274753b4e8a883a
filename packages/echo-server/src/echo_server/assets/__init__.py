"""Artifacts shipped with the package for the embedded default pair (SmolLM2-135M-Instruct).

- ``smollm2-135m-eagle.safetensors`` / ``.json``: the EAGLE-style draft head (``echo-sd
  train-draft``) and its config;
- ``smollm2-135m-eagle.gate.json``: the calibrated GatePolicy (``echo-sd calibrate``);
- ``smollm2-135m-eagle.confidence.png``: per-depth confidence histograms from the calibration;
- ``DATA_CARD.md``: the training data, steps, wall time and measured quality.
"""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent
DEFAULT_HEAD = ASSETS / "smollm2-135m-eagle.safetensors"
DEFAULT_GATE = ASSETS / "smollm2-135m-eagle.gate.json"
DEFAULT_HISTOGRAM = ASSETS / "smollm2-135m-eagle.confidence.png"
DATA_CARD = ASSETS / "DATA_CARD.md"
