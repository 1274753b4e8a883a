"""Host-side scheduling per step against a measured GPU step, on the recorded pools (a benchmark,
not a test): ``python scripts/schedule_vs_gpu.py [--traces PATH...] [--gpu-cost PATH]``.

The replay (``echo-sd sim``) prices a step by the model's work alone: its cost models leave the
policy's own host time out. This script measures that time on the same recorded pools: each arm
is driven through ``--steps`` composed batches per (trace, B) by the replay's own
:func:`echo_scheduler.replay.run.replay_step` (the floor's ``step_batch``,
:func:`~echo_scheduler.driver.drive_step`, ``observe`` and the floor's ``observe``), which times
every host call of the policy and the floor (wall and process CPU, one torch thread) and leaves
out only the recorded pool's growth (the drafter's GPU work). Per cell it prints the median over
steps (the first step of each arm warms the allocator and is dropped) next to the measured GPU
verify pass at that step's rows (``--gpu-cost``, default ``traces/cost-gpu-h200-llama8b.json``):

    share = host ms / (verify ms + draft ms)

and two rates: ``tok/s gpu`` = sum(B + accepted) / sum(verify + draft seconds) over every step
(the replay's ``tokens_per_s`` under that cost model, the same steps and decisions: a check),
and ``+host`` = the same over the steps after the first with each step's host time added, as
if the host ran serially with the device.

A share that is not small must be hidden behind the GPU (overlapped with the previous step's
verify) or moved onto the device, or it eats the policy's gain. Name the CPU next to the
figures: the host is whatever machine runs this.
"""

from __future__ import annotations

import argparse
import platform
import statistics
from pathlib import Path

import torch

from echo_scheduler.elastic import ElasticFloor
from echo_scheduler.policies import make_policy
from echo_scheduler.replay.arms import default_arms, select_arms
from echo_scheduler.replay.costs import load_profiled
from echo_scheduler.replay.run import calibrate_rows, compose_steps, replay_step, split_warmup
from echo_scheduler.rows import load_rows

REPO = Path(__file__).resolve().parents[3]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--traces", type=Path, nargs="+", default=sorted((REPO / "traces").glob("trace-*.json.gz"))
    )
    p.add_argument("--gpu-cost", type=Path, default=REPO / "traces" / "cost-gpu-h200-llama8b.json")
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--arms", nargs="+", default=["echo", "chain/n=1", "eagle2/n=4", "static/2"])
    p.add_argument("--steps", type=int, default=20, help="composed steps per cell (the replay's)")
    args = p.parse_args()
    torch.set_num_threads(1)
    cost = load_profiled(args.gpu_cost, "gpu")
    arms = [a for a in select_arms(default_arms(), args.arms) if a.name in args.arms]
    print(f"# host: {_cpu_name()}, one torch thread; GPU step: {cost.machine.get('device')} "
          f"({args.gpu_cost.name}); {args.steps} steps per cell; medians and the host-serial rate "
          "drop each arm's first step")  # fmt: skip
    print(f"{'trace':<10} {'B':>4} {'arm':<11} {'host ms':>8} {'cpu ms':>7} {'gpu ms':>7} "
          f"{'share':>6} {'rows/req':>8} {'tok/s gpu':>10} {'+host':>9}")  # fmt: skip
    for path in args.traces:
        name = path.name.removeprefix("trace-").split(".")[0]
        warm, rows = split_warmup(load_rows([path]), 0.3, 0)
        gates = calibrate_rows(warm, 8)
        for b in args.batches:
            steps = compose_steps(rows, b, args.steps, 0)
            for arm in arms:
                gate = gates[arm.gate] if arm.gate is not None else None
                policy = make_policy(arm.policy, arm.config, gate=gate)
                floor = ElasticFloor(cost.verify_model(b)) if arm.floor else None
                host, cpu, gpu, per_req, tokens = [], [], [], [], []
                all_tokens = all_gpu = 0.0
                serials: dict[str, int] = {}
                for i, st in enumerate(steps):
                    step = replay_step(policy, st, arm.budget(b), floor, cost, serials)
                    ver, acc = int(step.verified.sum()), int(step.lengths.sum())
                    run = step.run
                    gpu_s = cost.verify_s(b, b + ver) + cost.draft_s(b, run.depths, run.expansions)
                    all_tokens += b + acc
                    all_gpu += gpu_s
                    if i:
                        tokens.append(b + acc)
                        host.append(step.host_s)
                        cpu.append(step.host_cpu_s)
                        gpu.append(gpu_s)
                        per_req.append(ver / b)
                h, g = statistics.median(host), statistics.median(gpu)
                serial = sum(tokens) / (sum(gpu) + sum(host))
                print(
                    f"{name:<10} {b:>4} {arm.name:<11} {1e3 * h:>8.2f} "
                    f"{1e3 * statistics.median(cpu):>7.2f} {1e3 * g:>7.2f} {h / g:>6.1%} "
                    f"{statistics.mean(per_req):>8.2f} {all_tokens / all_gpu:>10.1f} "
                    f"{serial:>9.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
