"""Host syncs per step inside the policies' own calls, on the recorded pools (issue #44).

Every call that would copy a device value to the host (``item``, ``tolist``, ``bool()`` of a
tensor, ``nonzero``, boolean-mask indexing, ...; :class:`echo_core.testing.HostSyncCounter`)
stalls the host on a GPU until the device catches up, so a policy that is to run on the device's
tensors inside a step must make few of them, and never more at a larger batch. The count does not
depend on the device, so this runs on the CPU: per (trace, B, arm) cell of
:func:`echo_lab.replay.hosttime.host_rows` it drives ``--steps`` composed steps with the counter
around each policy call and prints the syncs per step; ``--sites`` adds, per cell, where the
syncs of ECHO's arms are (file:line, per step). ECHO takes the path it takes on a GPU
(``EchoPolicy.sync_free``); ``--cpu-path`` counts the CPU's instead, which reads a count where
that skips work (free on the CPU).

    .venv/bin/python packages/echo-lab/scripts/policy_syncs.py [--batches 16 64 256] [--sites]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from echo_core.testing import HostSyncCounter
from echo_lab.replay.costs import load_profiled
from echo_lab.replay.hosttime import add_cell_arguments, host_rows
from echo_scheduler.policies.echo import EchoPolicy

REPO = Path(__file__).resolve().parents[3]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cell_arguments(p, REPO)
    p.add_argument("--steps", type=int, default=3, help="composed steps per cell")
    p.add_argument("--sites", action="store_true", help="where ECHO's syncs are, per cell")
    p.add_argument("--cpu-path", action="store_true", help="ECHO's CPU path, not its GPU one")
    args = p.parse_args()
    EchoPolicy.sync_free = not args.cpu_path
    torch.set_num_threads(1)
    cost = load_profiled(args.gpu_cost, "gpu")
    counter = HostSyncCounter()
    print(f"{'trace':<10} {'B':>4} {'arm':<11} {'syncs/step':>10}")
    rows = host_rows(
        args.traces, args.batches, args.arms, cost, args.steps, torch.device("cpu"),
        lambda: counter,
    )  # fmt: skip
    for row in rows:
        print(f"{row.trace:<10} {row.batch:>4} {row.arm:<11} {counter.total / args.steps:>10.1f}")
        if args.sites and row.arm.startswith("echo"):
            for (op, site), n in sorted(counter.sites.items(), key=lambda kv: -kv[1]):
                print(f"{'':<17} {n / args.steps:>5.1f} {op:<12} {site}")
        counter.counts.clear()
        counter.sites.clear()


if __name__ == "__main__":
    main()
