"""What ECHO's cost floor and cut do on its drafted steps at one concurrency (a diagnostic).

Runs ECHO alone on one workload (one round, the embedded default engine) and records, for every
drafted step over at least ``--min-batch`` requests: the floor ``u_min`` and node price, the run
rate R, the requests with a depth-1 node, their best depth-1 key, how many of those reach
``u_min``, and the rows the step verified. ``u_min / R`` is the price of a row in seconds
(echo_scheduler.elastic: ``dt = s_row max(secant, slope)``).

    .venv/bin/python packages/echo-server/scripts/probe_echo_floor.py --concurrency 32 \\
        --workload humaneval --num-prompts 64
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

from echo_core.tree import TreeBatch
from echo_scheduler.policies.echo import EchoPolicy
from echo_scheduler.ranking import PoolIndex
from echo_server.bench.suite import SuiteSpec, run_suite
from echo_server.bench.workloads import load_workloads
from echo_server.cli import build_parser
from echo_server.cli.bench import _factory
from echo_server.cli.options import load


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--workload", default="humaneval")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--min-batch", type=int, default=24)
    a = p.parse_args()
    stats: list[dict[str, float]] = []
    select = EchoPolicy.select

    def recording(self: EchoPolicy, pool: TreeBatch) -> Any:
        keep = select(self, pool)
        batch, first = self.batch, pool.depth == 1
        if batch.batch_size < a.min_batch or not bool(first.any()):
            return keep
        key, req = self.key(pool), PoolIndex.of(pool).req
        best = torch.full((pool.batch_size,), -1.0)
        best.scatter_reduce_(0, req[first], key[first], reduce="amax")
        best = best[best >= 0]
        rate = batch.row_price.rate if batch.row_price is not None else float("nan")
        stats.append(
            {
                "u_min": batch.min_utility,
                "row ms (u_min / R)": 1000 * batch.min_utility / rate,
                "node price": batch.node_price or 0.0,
                "R tok/s": rate,
                "roots": float(best.numel()),
                "best depth-1 key": float(best.mean()),
                "roots reaching u_min": float((best >= batch.min_utility).sum()),
                "rows verified": float(keep.sum()),
            }
        )
        return keep

    EchoPolicy.select = recording  # type: ignore[method-assign]
    torch.set_num_threads(1)
    argv = ["bench", "--threads", "1", "--max-tokens", "64", "--workloads", a.workload]
    args = build_parser().parse_args(argv)
    workloads = load_workloads([a.workload], a.num_prompts, None)
    make = _factory(load(args), args, workloads)
    run_suite(make, workloads, SuiteSpec(("echo",), (a.concurrency,), 64, rounds=1), progress=False)
    print(f"{a.workload} c={a.concurrency}: {len(stats)} drafted steps over >= {a.min_batch}")
    for name in stats[0] if stats else []:
        xs = [s[name] for s in stats]
        q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
        mean = statistics.fmean(xs)
        print(f"  {name}: median {q[1]:.3f} [{q[0]:.3f}, {q[2]:.3f}] mean {mean:.3f}")


if __name__ == "__main__":
    main()
