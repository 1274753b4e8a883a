"""Layer-wise confidence under the three gate labels, on recorded traces and the synthetic
drifting workload: the paper's layer-wise confidence figure and its conditional version.

    .venv/bin/python packages/echo-scheduler/scripts/layerwise_confidence.py \
        traces/trace-*.json.gz --out docs/bench/2026-12-04/layerwise

For each trace every recorded step's pool (drafted ungated to full depth, greedy, so every
node's acceptance is known) becomes warm-up records (``replay.gates.warmup_records``), then gate
samples: one per (request, step, depth) with the layer confidence ``C_b(d)``. It prints per depth
the AUC of ``C_b(d)`` under the labels ``reached`` (accepted length ``L >= d``, the paper's
figure), ``next`` (``L >= d + 1``) and ``conditional`` (``L >= d + 1`` given ``L >= d``: what a
gate at d decides), with the 95% lower bound, the sample count and the positive rate
(:mod:`echo_gating.layerwise`); with ``--out`` also one PNG per trace, the ``reached`` histograms
above the ``conditional`` ones (``echo_lab.training.calibration.layerwise_histograms``; needs
matplotlib, the ``plots`` extra). ``synthetic`` is echo-gating's seeded warm-up model
(``SyntheticSpec()``: separation 1.0 at depth 1 falling to 0 from depth 6, the drift the paper
describes), 2,000 requests x 4 steps, seed 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from echo_gating.layerwise import layerwise_markdown, layerwise_separation
from echo_gating.records import GateSamples, gate_samples
from echo_gating.testing import SyntheticSpec, synthetic_records
from echo_lab.replay.gates import warmup_records
from echo_lab.sim.trace import load_trace


def trace_samples(path: Path) -> GateSamples:
    """Gate samples of every recorded step of one trace."""
    return gate_samples(warmup_records(load_trace(path)))


def synthetic_samples(requests: int = 2000, steps: int = 4, seed: int = 0) -> GateSamples:
    """Gate samples of echo-gating's synthetic drifting warm-up model (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    return gate_samples(synthetic_records(SyntheticSpec(), g, requests, steps))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", type=Path, nargs="+")
    p.add_argument("--max-depth", type=int, default=6)
    p.add_argument("--out", type=Path, help="write <name>.png per trace here")
    args = p.parse_args()
    torch.set_num_threads(1)
    sets = {path.name.removeprefix("trace-").split(".")[0]: path for path in args.traces}
    named: list[tuple[str, GateSamples]] = [(n, trace_samples(p)) for n, p in sets.items()]
    named.append(("synthetic", synthetic_samples()))
    for name, samples in named:
        rows = layerwise_separation(samples, args.max_depth)
        print(f"\n### {name}: AUC of C_b(d) [95% lower bound] (samples, positive rate)\n")
        print(layerwise_markdown(rows), flush=True)
        if args.out is not None:
            from echo_lab.training.calibration import layerwise_histograms

            png = args.out / f"{name}.png"
            layerwise_histograms(
                samples,
                png,
                args.max_depth,
                title=f"{name}: layer confidence C_b(d), unconditional (top) vs conditional",
            )
            print(f"\n{png}")


if __name__ == "__main__":
    main()
