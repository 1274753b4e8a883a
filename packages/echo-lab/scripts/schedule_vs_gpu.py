"""Host-side scheduling per step against a measured GPU step, on the recorded pools (a benchmark,
not a test): ``python scripts/schedule_vs_gpu.py [--traces PATH...] [--gpu-cost PATH]``.

The figures and their definitions are :mod:`echo_lab.replay.hosttime`'s: per (trace, B,
arm) the median host ms of the policy's and the floor's calls per step, the measured GPU step
at that step's rows (``--gpu-cost``, default ``traces/cost-gpu-h200-llama8b.json``), their
ratio, the GPU-only rate (the replay's ``tokens_per_s``, a check) and the host-serial rate
(``+host``); then per cell ECHO over the best other arm it ran (``--all-fixed``: every fixed arm
of the replay's grid and plain decoding). Here the policy runs on the CPU with one torch thread,
so name the CPU next to the figures; ``python -m gpu_check --parts schedule``
(scripts/gpu_check) runs the same cells with the policy's tensors on the GPU.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from echo_lab.bench.intervals import cpu_name
from echo_lab.replay.costs import load_profiled
from echo_lab.replay.hosttime import (
    FIXED_ARMS,
    HEADER,
    add_cell_arguments,
    echo_vs_best,
    format_comparison,
    host_rows,
)

REPO = Path(__file__).resolve().parents[3]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cell_arguments(p, REPO)
    p.add_argument(
        "--all-fixed", action="store_true", help="ECHO, plain and every fixed arm of the grid"
    )
    p.add_argument("--steps", type=int, default=20, help="composed steps per cell (the replay's)")
    args = p.parse_args()
    torch.set_num_threads(1)
    cost = load_profiled(args.gpu_cost, "gpu")
    print(f"# host: {cpu_name()}, one torch thread; GPU step: {cost.machine.get('device')} "
          f"({args.gpu_cost.name}); {args.steps} steps per cell; medians and the host-serial rate "
          "drop each arm's first step")  # fmt: skip
    print(HEADER)
    arms = list(FIXED_ARMS) if args.all_fixed else args.arms
    rows = []
    for row in host_rows(args.traces, args.batches, arms, cost, args.steps):
        rows.append(row)
        print(row.line(), flush=True)
    for cell in echo_vs_best(rows):
        print(format_comparison(cell), flush=True)


if __name__ == "__main__":
    main()
