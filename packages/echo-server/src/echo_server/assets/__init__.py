"""Artifacts shipped with the package for the embedded default pair (SmolLM2-135M-Instruct).

- ``smollm2-135m-eagle.safetensors`` / ``.json``: the EAGLE-style draft head (``echo-sd
  train-draft``) and its config;
- ``smollm2-135m-eagle.gate.json``: the calibrated GatePolicy (``echo-sd calibrate``);
- ``smollm2-135m-eagle.confidence.png``: per-depth confidence histograms from the calibration;
- ``smollm2-135m-eagle-ngram.gate.json`` / ``.confidence.png``: the same for the head in union
  with prompt lookup (``echo-sd calibrate --with-ngram``, drafting/mixture.py);
- ``<gate>.dense.gate.json`` / ``<gate>.fixed.gate.json`` beside each gate: the paper's two
  ablations (a gate at every depth; one threshold for all depths), calibrated by the same
  ``echo-sd calibrate`` run from the same warm-up records, acceptance maps included;
- ``smollm2-135m-eagle-2026-11-29.safetensors`` / ``.json`` / ``.gate.json``: the head shipped
  from 2026-11-29 to 2026-12-06 and its calibrated gate (head alone), kept for one release so a
  benchmark can run both heads side by side (``bench_echo_variants.py --arms ... echo-prevhead``);
- ``DATA_CARD.md``: the training data, steps, wall time and measured quality.
"""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent
DEFAULT_HEAD = ASSETS / "smollm2-135m-eagle.safetensors"
DEFAULT_GATE = ASSETS / "smollm2-135m-eagle.gate.json"
DEFAULT_HISTOGRAM = ASSETS / "smollm2-135m-eagle.confidence.png"
MIXTURE_GATE = ASSETS / "smollm2-135m-eagle-ngram.gate.json"
MIXTURE_HISTOGRAM = ASSETS / "smollm2-135m-eagle-ngram.confidence.png"
DATA_CARD = ASSETS / "DATA_CARD.md"
PREVIOUS_HEAD = ASSETS / "smollm2-135m-eagle-2026-11-29.safetensors"
PREVIOUS_GATE = ASSETS / "smollm2-135m-eagle-2026-11-29.gate.json"


def ablation_gate(gate: Path, mode: str) -> Path:
    """Where the ``mode`` ablation (``dense`` or ``fixed``) of ``gate`` lives:
    ``X.gate.json`` -> ``X.<mode>.gate.json`` (written by the same ``echo-sd calibrate`` run)."""
    stem = gate.name.removesuffix(".json").removesuffix(".gate")
    return gate.with_name(f"{stem}.{mode}.gate.json")
