"""``echo-sd calibrate``: warm up the draft head, calibrate echo-gating's GatePolicy, plot.

Runs greedy generation on non-benchmark prompts with ungated full-depth drafting
(:mod:`echo_lab.training.calibration`), logs every verified node, then
``echo_gating.calibration_report`` picks checkpoint depths and thresholds. Writes the policy
JSON (``--out``) and, from the same records, the dense and fixed ablations beside it
(``X.dense.gate.json``, ``X.fixed.gate.json``), the per-depth confidence histograms
(``--png``), optionally the raw records (``--records``), and prints the calibration report.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from echo_gating.calibrate import CalibrationConfig, calibration_report
from echo_gating.policy import GateMode
from echo_gating.records import RecordSet
from echo_lab.training.calibration import (
    calibration_prompts,
    confidence_histograms,
    warmup_records,
)
from echo_server.assets import (
    DEFAULT_GATE,
    DEFAULT_HEAD,
    DEFAULT_HISTOGRAM,
    MIXTURE_GATE,
    MIXTURE_HISTOGRAM,
    ablation_gate,
)
from echo_server.drafting import NgramDrafter
from echo_server.drafting.base import Drafter
from echo_server.drafting.eagle_checkpoint import load_head
from echo_server.drafting.eagle_drafter import EagleDrafter
from echo_server.drafting.mixture import MixtureDrafter
from echo_server.model.loader import load_model


def add_parser(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="warm-up records -> calibrated GatePolicy + histograms")
    p.add_argument("--model", default=None, help="GGUF file or HF directory (default: embedded)")
    p.add_argument("--head", type=Path, default=DEFAULT_HEAD, help="draft head (.safetensors)")
    p.add_argument(
        "--with-ngram",
        action="store_true",
        help="calibrate the head in union with prompt lookup (--drafter eagle+ngram)",
    )
    p.add_argument("--out", type=Path, default=None, help="GatePolicy JSON (default: shipped)")
    p.add_argument("--png", type=Path, default=None, help="histogram PNG (default: shipped)")
    p.add_argument("--records", type=Path, default=None, help="also save the warm-up records")
    p.add_argument("--prompts", type=int, default=32, help="warm-up prompts (not benchmark)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--max-depth", type=int, default=8)
    p.add_argument("--cost-ratio", type=float, default=CalibrationConfig().cost_ratio)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--from-records",
        type=Path,
        default=None,
        help="calibrate records saved by an earlier --records run instead of warming up",
    )
    p.add_argument(
        "--no-ablations",
        action="store_true",
        help="skip the dense and fixed ablation gates (written beside --out by default)",
    )


def run(args: argparse.Namespace) -> int:
    if args.out is None:
        args.out = MIXTURE_GATE if args.with_ngram else DEFAULT_GATE
    if args.png is None:
        args.png = MIXTURE_HISTOGRAM if args.with_ngram else DEFAULT_HISTOGRAM
    start = time.perf_counter()
    # --from-records recalibrates saved warm-up records: no model needed
    records = RecordSet.load(args.from_records) if args.from_records else _warm_up(args)
    if args.records is not None:
        records.save(args.records)
    meta = {"target": "?", "drafter": "?", **records.meta}
    config = CalibrationConfig(max_depth=args.max_depth, cost_ratio=args.cost_ratio)
    report = calibration_report(records, config)
    report.policy.save(args.out)
    ablations = []
    if not args.no_ablations:  # the paper's two ablations, from the same records
        for mode in (GateMode.DENSE, GateMode.FIXED):
            path = ablation_gate(args.out, mode.value)
            ablation = calibration_report(records, dataclasses.replace(config, mode=mode)).policy
            ablation.save(path)
            ablations.append(f"{mode.value} {ablation.version} -> {path}")
    confidence_histograms(
        records, args.png, args.max_depth, title=f"{meta['drafter']} on {meta['target']}"
    )
    print(report.to_markdown())
    print(
        f"\n{len(records)} verified nodes in {time.perf_counter() - start:.0f} s; "
        f"policy {report.policy.version} -> {args.out}; histograms -> {args.png}"
    )
    for line in ablations:
        print(f"ablation {line}")
    return 0


def _warm_up(args: argparse.Namespace) -> RecordSet:
    """Greedy warm-up of the head (with prompt lookup under --with-ngram): every verified node."""
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    weights = loaded.model.weights
    head = load_head(args.head, weights.embed, weights.lm_head)
    drafter: Drafter = EagleDrafter(head)
    name = f"eagle:{Path(args.head).name}"
    if args.with_ngram:
        drafter, name = MixtureDrafter(drafter, NgramDrafter()), f"{name}+ngram"
    return warmup_records(
        loaded,
        drafter,
        calibration_prompts(args.prompts, args.seed),
        max_tokens=args.max_tokens,
        max_batch=args.max_batch,
        max_depth=args.max_depth,
        meta={"target": loaded.source.name, "drafter": name},
    )
