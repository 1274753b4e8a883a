"""Which property of a draft head lets ECHO's allocation pay: acceptance or separation (issue #45).

Writes synthetic traces for the replay into ``--out`` (a benchmark, not a test): the simulated
drafter of :class:`echo_scheduler.workloads.SyntheticWorkload`, in a 2 x 3 design.

- **Acceptance** (``continue_prob``, the chance that the target's next token is among a
  node's drafted children):
  - ``ours``: fitted to the shipped head's calibration (``SyntheticWorkload.from_reference`` on
    its gate's per-depth statistics);
  - ``eagle3like``: each depth's miss rate cut to 0.35 of ours (0.87-0.97 per depth);
  - ``llama``: the preset's 0.92 falling to 0.80.
- **Separation** (how far apart the draft confidences of accepted and rejected nodes lie):
  - ``lo``: the shipped head's, fitted from its calibration AUCs (0.75-0.85);
  - ``hi``: the llama preset's, 1.0 at depth 1 falling to 0.1 at depth 8. That is AUC
    0.93-0.98 at depths 1-4.

Each trace is 64 steps of 16 requests (1,024 rows), seed 11, recorded with the EAGLE-2
frontier to depth 8 (``echo_lab.sim.trace.record``). The measured H200 step model is copied
beside the traces. Then replay them::

    .venv/bin/python packages/echo-lab/scripts/synthetic_head_sweep.py --out /tmp/synth
    .venv/bin/echo-sd sim --traces /tmp/synth/trace-*.json.gz \\
        --cost-models h200-llama8b-measured --gpu-batches 64 256 --markdown /tmp/synth/replay.md

The synthetic drafter is a stylised model: fitted to the shipped head, it puts ECHO at 0.98 of
the best fixed tree at B = 256, where the head's recorded traces put it at 1.02-1.05. The
design's contrasts are what it is for.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

import torch

from echo_gating.policy import GatePolicy
from echo_lab.sim.trace import record, save_trace
from echo_scheduler.config import PolicyConfig
from echo_scheduler.workloads import SyntheticWorkload
from echo_server.assets import DEFAULT_GATE

REPO = Path(__file__).resolve().parents[3]
COST = REPO / "traces" / "cost-gpu-h200-llama8b.json"


def _fewer_misses(w: SyntheticWorkload, share: float) -> SyntheticWorkload:
    """``w`` with every depth's miss rate ``1 - alpha_d`` cut to ``share`` of it (at most
    0.97 acceptance)."""
    alpha = tuple(min(0.97, 1 - (1 - a) * share) for a in w.continue_prob)
    return dataclasses.replace(w, continue_prob=alpha)


def _separation(w: SyntheticWorkload, sep: tuple[float, ...]) -> SyntheticWorkload:
    """``w`` with ``sep`` per depth (the last value repeated to ``w``'s depth)."""
    full = (*sep, *(sep[-1],) * max(w.depth - len(sep), 0))[: w.depth]
    return dataclasses.replace(w, separation=full)


def variants() -> dict[str, SyntheticWorkload]:
    """The six workloads of the design (module docstring), by trace name."""
    ours = SyntheticWorkload.from_reference(dict(GatePolicy.load(DEFAULT_GATE).reference))
    llama = SyntheticWorkload.llama()
    acceptance = {"ours": ours, "eagle3like": _fewer_misses(ours, 0.35), "llama": llama}
    separation = {"lo": ours.separation, "hi": llama.separation}
    return {
        f"{a}-{s}": _separation(w, sep)
        for a, w in acceptance.items()
        for s, sep in separation.items()
    }


def auc_variants(aucs: list[float]) -> dict[str, SyntheticWorkload]:
    """The shipped head's acceptance with one separation per AUC in ``aucs`` (every depth the
    same AUC), by trace name: how much separation ECHO's allocation needs."""
    ours = SyntheticWorkload.from_reference(dict(GatePolicy.load(DEFAULT_GATE).reference))
    out = {}
    for a in aucs:
        sep = SyntheticWorkload.separation_for_auc(
            torch.tensor([a], dtype=torch.float64), ours.noise
        )
        out[f"ours-auc{a:.2f}"] = _separation(ours, (float(sep[0]),))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the traces")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument(
        "--aucs",
        type=float,
        nargs="+",
        default=None,
        help="instead of the 2 x 3 design: the head's acceptance at each of these separations "
        "(one AUC for every depth)",
    )
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    config = PolicyConfig()
    design = variants() if args.aucs is None else auc_variants(args.aucs)
    for name, w in design.items():
        steps = w.sample(args.batch, args.steps, torch.Generator().manual_seed(args.seed))
        path = args.out / f"trace-{name}.json.gz"
        save_trace([record(s, config) for s in steps], path)
        alpha = " ".join(f"{a:.2f}" for a in w.continue_prob[: config.max_depth])
        sep = " ".join(f"{s:.2f}" for s in w.separation[: config.max_depth])
        print(f"{path.name}: acceptance {alpha}; separation {sep}")
    shutil.copy(COST, args.out / COST.name)


if __name__ == "__main__":
    main()
