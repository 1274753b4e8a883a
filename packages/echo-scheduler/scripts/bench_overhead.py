"""Scheduling overhead per decode step, a benchmark (not a test): scripts/bench_overhead.py.

For B in {1, 16, 64, 256}, pools of about 100 candidates per request (high-concurrency config:
top-k 3 frontier, 4 children per node, depth 8; budget 4 per request), times only the policy's
own calls (begin_step + after_depth per depth + select), median over steps, single-threaded torch,
and relates it to the verify step of the roofline model (H200, Llama-3.1-8B, context 2,048).
Also reports the process CPU time of the same calls (``cpu ms``): on a shared machine wall time
inflates. ``share`` = wall ms / verify ms.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from echo_gating.policy import GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.cost import Hardware, ModelGeometry, VerifyCostModel
from echo_scheduler.policies import make_policy
from echo_scheduler.simulator import drive
from echo_scheduler.workloads import SyntheticWorkload

CONFIG = PolicyConfig(max_depth=8, max_width=4)
GATE = GatePolicy.sparse({2: 0.05, 4: 0.02}, max_depth=8)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--policies", nargs="+", default=["eagle2", "global_topk", "echo"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"{'policy':<12} {'B':>4} {'nodes/req':>9} {'sched ms':>9} {'cpu ms':>7} "
        f"{'verify ms':>9} {'share':>7}"
    )
    for b in (1, 16, 64, 256):
        steps = SyntheticWorkload.llama().sample(
            b, args.steps + 1, torch.Generator().manual_seed(b)
        )
        verify_s = VerifyCostModel.roofline(
            Hardware.h200(), ModelGeometry.llama31_8b(), b, 2048
        ).latency_at(5 * b)
        for name in args.policies:
            times, cpu, nodes = [], [], []
            for i, step in enumerate(steps):
                policy = make_policy(name, CONFIG, gate=GATE if name.startswith("echo") else None)
                run = drive(policy, step.with_max_nodes(torch.full((b,), 1 << 30)), 4 * b)
                if i:  # the first step warms up the allocator
                    times.append(run.schedule_s)
                    cpu.append(run.schedule_cpu_s)
                    nodes.append(run.pool.num_nodes / b)
            ms = 1e3 * statistics.median(times)
            print(
                f"{name:<12} {b:>4} {statistics.mean(nodes):>9.0f} {ms:>9.2f} "
                f"{1e3 * statistics.median(cpu):>7.2f} {1e3 * verify_s:>9.2f} "
                f"{ms / (1e3 * verify_s):>7.1%}"
            )


if __name__ == "__main__":
    main()
