"""Projection to production scale: real draft trees, a roofline latency model, echo-scheduler's
simulator.

Inputs are the trace rows of a real run (:mod:`echo_lab.bench.traces`: pools drafted by the
configured drafter to full depth without gating, with the target's actual continuations). For
each hardware x model x batch size B, ``steps`` batches of B rows are composed and every policy
is replayed through :func:`echo_scheduler.simulator.run_step` (the engine's exact call
sequence, greedy acceptance against the recorded continuation), at two budgets:

- ``knee``: K = K_max(B) of the latency model (fill the verify pass up to the compute knee:
  ECHO's operating point);
- ``4/req``: K = 4B (every request's fixed EAGLE-2 tree of N - 1 = 4 draft tokens: what SGLang's
  EAGLE verifies whatever the load, past the knee if need be).

Latency model (:class:`echo_scheduler.cost.VerifyCostModel.roofline`, constants written down):

- verify: ``t(T) = base + s_cmp * max(0, T - T0)`` for T = B + verified tokens, with
  ``base = (weight bytes + B * context * KV bytes per token) / (bandwidth * 0.8)``,
  ``s_cmp = 2 * active params / (peak bf16 FLOP/s * 0.6)`` and the knee ``T0 = base / s_cmp``:
  flat while memory-bound, linear once compute-bound; attention FLOPs ignored;
- H100 SXM: 989 TFLOP/s bf16 dense, 3.35 TB/s; H200: 989 TFLOP/s, 4.8 TB/s;
- Llama-3.1-8B on one GPU: 16.0 GB bf16 weights, 16 GFLOP per token, 128 KiB KV per token;
- Qwen3-235B-A22B over 8 GPUs (TP 8; per GPU): 58.8 GB of weights (every expert is read at
  these batch sizes), 5.5 GFLOP per token (22B active), 24 KiB KV per token;
- mean context 1,024 tokens (fits B = 256 in 80 GB for both);
- drafting: ``t_draft = 0.4 ms per drafted depth + 1.5 us per expanded node`` (an EAGLE-3 head;
  :class:`echo_scheduler.simulator.DraftCostModel`); step time = t_draft + t_verify; throughput
  = (B + accepted) / step time.

ECHO's gates are calibrated on a held-out share of the rows (the paper's warm-up); ECHO's
``min_depth_gain`` is :func:`echo_lab.sim.compare.depth_price` as in the simulator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from echo_core.errors import EchoError
from echo_gating.policy import GatePolicy
from echo_lab.bench.traces import TraceRow, compose
from echo_lab.replay.run import calibrate_rows
from echo_lab.sim.compare import depth_price, make
from echo_lab.sim.trace import RecordedStep
from echo_scheduler.config import PolicyConfig
from echo_scheduler.cost import Hardware, ModelGeometry, VerifyCostModel
from echo_scheduler.simulator import DraftCostModel, run_step, summarize

HARDWARE = {"H100": Hardware.h100(), "H200": Hardware.h200()}
MODELS = {
    "Llama-3.1-8B": ModelGeometry.llama31_8b(),
    "Qwen3-235B-A22B": ModelGeometry.qwen3_235b_a22b(devices=8),
}
PAPER = {
    # model -> (EAGLE-2-style tok/s, ECHO tok/s) at batch 256 on H100 (paper, SGLang)
    "Llama-3.1-8B": (10703.0, 11551.0),
    "Qwen3-235B-A22B": (2803.0, 3207.0),
}
MIN_ROWS = 100
"""Fewer rows cannot calibrate the gates (echo-gating wants 20 samples per depth and class)."""
POLICIES = ("plain", "chain", "static", "eagle2", "global_topk", "echo", "echo_dense", "echo_fixed")


@dataclass(frozen=True, slots=True)
class ProjectionSpec:
    batches: tuple[int, ...] = (64, 128, 256)
    steps: int = 24
    context: int = 1024
    seed: int = 0
    calibration_share: float = 0.3
    policies: tuple[str, ...] = POLICIES


def _simulate(
    steps: Sequence[RecordedStep],
    policy_name: str,
    config: PolicyConfig,
    gates: dict[str, GatePolicy],
    verify: VerifyCostModel,
    draft: DraftCostModel,
    budget: int,
) -> dict[str, float]:
    b = steps[0].batch_size
    priced = replace(config, min_depth_gain=depth_price(verify, draft, b, budget))
    policy = make(policy_name, priced, gates)
    s = summarize(
        [run_step(policy, st, budget, config.draft_width) for st in steps], b, verify, draft
    )
    return {
        "tokens_per_s": s.tokens_per_s,
        "mean_accepted_length": s.mat,
        "draft_yield": s.draft_yield,
        "verified_per_step": s.verified,
        "selection": s.selection,
    }


def project(rows: Sequence[TraceRow], spec: ProjectionSpec | None = None) -> dict[str, Any]:
    """Projected throughput per policy (module docstring); a JSON-ready document."""
    spec = spec or ProjectionSpec()
    if len(rows) < MIN_ROWS:
        raise EchoError(f"need at least {MIN_ROWS} trace rows to project, got {len(rows)}")
    g = torch.Generator().manual_seed(spec.seed)
    order = torch.randperm(len(rows), generator=g).tolist()
    n_cal = max(1, int(len(rows) * spec.calibration_share))
    cal = [rows[i] for i in order[:n_cal]]
    evaluation = [rows[i] for i in order[n_cal:]]
    config = PolicyConfig.high_concurrency()
    gates = calibrate_rows(cal, config.max_depth)
    draft = DraftCostModel()
    points: list[dict[str, Any]] = []
    for batch in spec.batches:
        steps = [compose(evaluation, batch, g) for _ in range(spec.steps)]
        for hw_name, hw in HARDWARE.items():
            for model_name, geometry in MODELS.items():
                verify = VerifyCostModel.roofline(hw, geometry, batch, spec.context)
                budgets = {"knee": max(verify.k_max(batch), 1), "4/req": 4 * batch}
                for label, k in budgets.items():
                    for name in spec.policies:
                        m = _simulate(steps, name, config, gates, verify, draft, k)
                        points.append(
                            {
                                "hardware": hw_name,
                                "model": model_name,
                                "batch": batch,
                                "budget_label": label,
                                "budget": k,
                                "policy": name,
                                **m,
                            }
                        )
    return {
        "spec": {
            "batches": list(spec.batches),
            "steps": spec.steps,
            "context": spec.context,
            "seed": spec.seed,
            "rows": len(rows),
            "calibration_rows": n_cal,
        },
        "points": points,
        "margins": margins(points),
    }


def best(points: Sequence[dict[str, Any]], hw: str, model: str, batch: int, policy: str) -> float:
    """A policy's throughput at its better budget."""
    vals = [
        float(p["tokens_per_s"])
        for p in points
        if p["hardware"] == hw
        and p["model"] == model
        and p["batch"] == batch
        and p["policy"] == policy
    ]
    return max(vals) if vals else 0.0


def margins(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """ECHO over the EAGLE-2-style tree (each at its better budget), beside the paper's figure."""
    out = []
    batches = sorted({int(p["batch"]) for p in points})
    for hw in HARDWARE:
        for model, (paper_e2, paper_echo) in PAPER.items():
            for batch in batches:
                e2 = best(points, hw, model, batch, "eagle2")
                echo = best(points, hw, model, batch, "echo")
                out.append(
                    {
                        "hardware": hw,
                        "model": model,
                        "batch": batch,
                        "eagle2_tokens_per_s": e2,
                        "echo_tokens_per_s": echo,
                        "margin": echo / e2 - 1.0 if e2 else None,
                        "paper_margin": paper_echo / paper_e2 - 1.0 if batch == 256 else None,
                    }
                )
    return out


def projection_tables(doc: dict[str, Any]) -> str:
    """Markdown: throughput per policy at each batch (better budget), then the margins."""
    points = doc["points"]
    policies = list(dict.fromkeys(p["policy"] for p in points))
    batches = doc["spec"]["batches"]
    lines = []
    for hw in HARDWARE:
        for model in MODELS:
            lines.append(f"\n**{model} on {hw}** (simulated tok/s, better of K=knee and K=4B)\n")
            lines.append("| policy | " + " | ".join(f"B={b}" for b in batches) + " |")
            lines.append("|---|" + "---:|" * len(batches))
            for pol in policies:
                cells = " | ".join(f"{best(points, hw, model, b, pol):,.0f}" for b in batches)
                lines.append(f"| {pol} | {cells} |")
    lines.append("\n| hardware | model | B | EAGLE-2 tok/s | ECHO tok/s | ECHO margin | paper |")
    lines.append("|---|---|---:|---:|---:|---:|---:|")
    for m in doc["margins"]:
        margin = "-" if m["margin"] is None else f"{100 * m['margin']:+.1f}%"
        paper = "-" if m["paper_margin"] is None else f"{100 * m['paper_margin']:+.1f}%"
        lines.append(
            f"| {m['hardware']} | {m['model']} | {m['batch']} | {m['eagle2_tokens_per_s']:,.0f} "
            f"| {m['echo_tokens_per_s']:,.0f} | {margin} | {paper} |"
        )
    return "\n".join(lines)
