"""Warm-up calibration for replay: ECHO's gates and its ablations from the same recorded pools.

Every warm-up pool was drafted to full depth without gating and every node's greedy acceptance
is known, so all six gate variants come from one :class:`~echo_gating.records.RecordSet`:

- ``echo``: the sparse gate (calibrated checkpoints and thresholds) with acceptance maps;
- ``echo_nogate``: the same acceptance maps and no checkpoint at all (maps + cost floor only);
- ``echo_dense``: a calibrated threshold at every depth, with maps (the paper's first ablation);
- ``echo_fixed``: one calibrated threshold at every depth, with maps (the second ablation);
- ``echo_k2``: the sparse gate with exactly two checkpoints (the best two depths by AUC), for
  when calibration finds no depth that passes ``min_auc`` and the sparse gate is empty;
- ``echo_next_k2``: the same, calibrated on the label a truncation at d actually removes,
  accepted length >= d + 1 (``CalibrationConfig.label_rule = "next"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from echo_gating.calibrate import CalibrationConfig, calibrate
from echo_gating.policy import GateMode, GatePolicy
from echo_gating.records import RecordSet, RecordWriter
from echo_lab.sim.trace import RecordedStep
from echo_scheduler.outcome import accepted_mask

MAP_BINS = 512
"""Acceptance-map resolution: wide pools put most nodes at low scores, so quantile bins need to
be fine for the few high-score nodes (the ones that get selected) to get bins of their own."""
GATE_NAMES = ("echo", "echo_nogate", "echo_dense", "echo_fixed", "echo_k2", "echo_next_k2")


def warmup_records(steps: Sequence[RecordedStep], drafter: str = "trace") -> RecordSet:
    """Every node of every step with its greedy acceptance (request ids unique across steps)."""
    writer = RecordWriter(meta={"drafter": drafter, "sampling": "greedy"})
    base = 0
    for i, step in enumerate(steps):
        b = step.batch_size
        writer.append_pool(
            step.pool,
            accepted_mask(step.pool, step.target),
            request_id=torch.arange(base, base + b),
            step=torch.full((b,), i, dtype=torch.int64),
        )
        base += b
    return writer.finish()


def calibrate_variants(
    records: RecordSet, max_depth: int, cost_ratio: float = 0.5
) -> dict[str, GatePolicy]:
    """The six gate variants of the module docstring, keyed by arm name."""
    out = {}
    for name, mode, rule, k in (
        ("echo", GateMode.SPARSE, "reached", None),
        ("echo_dense", GateMode.DENSE, "reached", None),
        ("echo_fixed", GateMode.FIXED, "reached", None),
        ("echo_k2", GateMode.SPARSE, "reached", 2),
        ("echo_next_k2", GateMode.SPARSE, "next", 2),
    ):
        cfg = CalibrationConfig(
            mode=mode,
            max_depth=max_depth,
            cost_ratio=cost_ratio,
            map_bins=MAP_BINS,
            label_rule=rule,
            num_checkpoints=k,
        )
        out[name] = calibrate(records, cfg)
    sparse = out["echo"]
    out["echo_nogate"] = replace(
        sparse, version=f"{sparse.version}+nogate", mode=GateMode.NONE, thresholds={}
    )
    return out
