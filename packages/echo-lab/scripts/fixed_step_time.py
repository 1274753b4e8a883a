"""ECHO's fixed-layout step on the CPU beside the host policies' own time (a benchmark, not a
test): ``python packages/echo-lab/scripts/fixed_step_time.py [--batches 16 64 256]``.

Per (trace, B), one torch thread, ``--rounds`` interleaved rounds; each round times

- ``fixed``: :func:`echo_lab.replay.fixedstep.run_step` alone on every drafted step captured
  from ``echo_device`` (the policy part with no host sync: after each depth and the selection),
  median over steps;
- ``compiled`` (with ``--compiled``): the same steps served by
  :class:`echo_lab.replay.fixedstep.StepGraphs` ``(compiled=True)``, one ``torch.compile`` of
  the step per step shape over held buffers (compiled before the first round, untimed; the
  seconds it took are printed per cell), its prices reloaded per run as ``fixed``'s are (the
  slabs' copy into the buffers untimed: :func:`~echo_lab.replay.fixedstep.time_served`),
  median over steps;
- ``echo``, ``echo_device``, ``chain/n=1``: the replay's host time per step
  (:func:`echo_lab.replay.hosttime.host_rows`: every policy call, ``observe`` and the floor),
  median over steps. ``echo_device`` adds the packed-pool conversion (the adapter) to ``fixed``
  and to ECHO's per-step host work (pre-check, ledger, floor, observe).

Prints the median of the rounds' medians with their range, the host syncs inside the fixed step
(it must make none) and whether its re-run selections (eager and, with ``--compiled``,
compiled) equal the captured ones.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from echo_core.testing import HostSyncCounter
from echo_lab.bench.intervals import cpu_name
from echo_lab.replay.costs import load_profiled
from echo_lab.replay.fixedstep import (
    StepGraphs,
    capture_steps,
    run_step,
    time_eager,
    time_served,
)
from echo_lab.replay.hosttime import add_cell_arguments, host_rows

REPO = Path(__file__).resolve().parents[3]
HOST_ARMS = ("echo", "echo_device", "chain/n=1")


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):6.3f} [{min(values):.3f}, {max(values):.3f}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cell_arguments(p, REPO)
    p.add_argument("--steps", type=int, default=20, help="composed steps per cell")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--compiled", action="store_true", help="add the torch.compile'd step (seconds per shape)"
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    cost = load_profiled(args.gpu_cost, "gpu")
    columns = ("fixed", *(("compiled",) if args.compiled else ()), *HOST_ARMS)
    print(f"# {cpu_name()}, one torch thread; {args.steps} composed steps per cell, "
          f"{args.rounds} interleaved rounds; ms per step: median of the rounds' medians "
          "[range]")  # fmt: skip
    print(f"{'trace':<10} {'B':>4} {'depths':>6} {'syncs':>5} {'same':>4} "
          + " ".join(f"{a:>24}" for a in columns)
          + (f" {'shapes':>6} {'compile s':>9}" if args.compiled else ""))  # fmt: skip
    for trace in args.traces:
        name = trace.name.removeprefix("trace-").split(".")[0]
        for b in args.batches:
            steps = capture_steps(trace, b, args.steps, cost)
            with HostSyncCounter() as syncs:
                same = all(torch.equal(run_step(s), s.keep) for s in steps)
            graphs = StepGraphs(compiled=args.compiled)
            began = time.perf_counter()
            if args.compiled:  # compile every shape before timing
                same &= all(torch.equal(graphs.run(s), s.keep) for s in steps)
            compile_s = time.perf_counter() - began
            timed: dict[str, list[float]] = {a: [] for a in columns}
            for _ in range(args.rounds):
                for row in host_rows([trace], [b], list(HOST_ARMS), cost, args.steps):
                    timed[row.arm].append(row.host_ms)
                per_step = [time_eager(s, reps=1) for s in steps]  # one warm run, one timed
                timed["fixed"].append(statistics.median(per_step))
                if args.compiled:
                    per_step = [time_served(graphs, s, reps=1) for s in steps]
                    timed["compiled"].append(statistics.median(per_step))
            depths = statistics.mean(s.depths for s in steps) if steps else 0.0
            print(f"{name:<10} {b:>4} {depths:>6.2f} {syncs.total / max(len(steps), 1):>5.1f} "
                  f"{'yes' if same else 'NO':>4} "
                  + " ".join(f"{_fmt(v):>24}" for v in timed.values())
                  + (f" {graphs.captures:>6} {compile_s:>9.1f}" if args.compiled else ""),
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
