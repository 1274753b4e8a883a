"""Every policy side by side on one synthetic trace: ``python -m echo_lab.sim.compare``.

For each batch size B the same seeded steps are replayed through every policy at several budgets
(``1/req`` = B, ``4/req`` = 4B, ``knee`` = K_max of the verify-cost model at that B). ECHO's gates
are calibrated first, as in the paper's warm-up: separate warm-up steps are drafted to full depth
without gating, every node is recorded with its acceptance, and echo-gating's ``calibrate``
returns the sparse (``echo``), dense (``echo_dense``) and fixed-threshold (``echo_fixed``) gates
(``echo_noledger`` uses the sparse one). B <= 4 uses the low-concurrency
config, larger B the high-concurrency one; ECHO's ``min_depth_gain`` is set to
:func:`depth_price` and every step's ``node_price`` to :func:`node_price` (the drafting cost per
call and per expanded node). The table
reports per step: accepted draft tokens, verified, mean accepted length (incl. bonus), draft
yield, simulated tokens/s, ``select`` (accepted / the best as many verified rows could get from
the policy's own pool) and ``cover`` (what its pool left reachable / what full-width drafting
reaches), both as :mod:`echo_scheduler.simulator` defines them. ``--json PATH`` also writes
every row.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import torch

from echo_gating.policy import GatePolicy
from echo_lab.replay.cli import main as replay_main
from echo_lab.replay.gates import calibrate_variants, warmup_records
from echo_lab.sim.trace import record
from echo_scheduler.config import PolicyConfig
from echo_scheduler.cost import Hardware, ModelGeometry, VerifyCostModel
from echo_scheduler.interface import BasePolicy
from echo_scheduler.policies import POLICY_NAMES, make_policy
from echo_scheduler.simulator import DraftCostModel, Summary, run_step, summarize
from echo_scheduler.workloads import SyntheticStep, SyntheticWorkload


@dataclass(frozen=True, slots=True)
class Row:
    batch_size: int
    budget_label: str
    budget: int
    policy: str
    summary: Summary


def calibrate_gates(
    steps: Sequence[SyntheticStep], config: PolicyConfig, cost_ratio: float = 0.5
) -> dict[str, GatePolicy]:
    """Sparse, dense and fixed gates (with acceptance maps) from warm-up steps, each drafted to
    ``max_depth`` without gating (:func:`~echo_lab.sim.trace.record`), plus the maps-only
    ``echo_nogate`` (:func:`echo_lab.replay.gates.calibrate_variants`)."""
    records = warmup_records([record(s, config) for s in steps], drafter="synthetic")
    return calibrate_variants(records, config.max_depth, cost_ratio)


def step_rate(verify: VerifyCostModel, batch: int, budget: int) -> float:
    """The step's expected throughput ``(B + min(K, B)) / t_verify(B + K)`` (tokens/s): a step
    is assumed to emit about one accepted token per request on top of the bonus token (the
    simulated MAT is 2-5)."""
    return (batch + min(budget, batch)) / verify.latency_at(batch + budget)


def depth_price(verify: VerifyCostModel, draft: DraftCostModel, batch: int, budget: int) -> float:
    """Tokens one more drafter call must promise: ``per_call_s * step_rate``."""
    return draft.per_call_s * step_rate(verify, batch, budget)


def node_price(verify: VerifyCostModel, draft: DraftCostModel, batch: int, budget: int) -> float:
    """Tokens one more expanded node must promise: ``per_node_s * step_rate``."""
    return draft.per_node_s * step_rate(verify, batch, budget)


def make(name: str, config: PolicyConfig, gates: dict[str, GatePolicy]) -> BasePolicy:
    shared = name == "echo_noledger"  # the sparse gate's variant
    return make_policy(name, config, gate=gates.get("echo" if shared else name))


def simulate(
    workload: SyntheticWorkload,
    batch_sizes: Sequence[int],
    steps: int,
    seed: int,
    verify_for: dict[int, VerifyCostModel],
    draft: DraftCostModel,
    policies: Sequence[str] = POLICY_NAMES,
) -> list[Row]:
    """Every policy at every (B, K) on the same seeded steps; returns one row per combination."""
    rows = []
    for b in batch_sizes:
        config = PolicyConfig.low_concurrency() if b <= 4 else PolicyConfig.high_concurrency()
        g = torch.Generator().manual_seed(seed + b)
        warm = workload.sample(64, 4, g)  # 256 warm-up requests, independent of the trace
        gates = calibrate_gates(warm, config)
        trace = workload.sample(b, steps, g)
        verify = verify_for[b]
        budgets = {"1/req": b, "4/req": 4 * b, "knee": max(verify.k_max(b), 1)}
        for label, k in budgets.items():
            priced = replace(config, min_depth_gain=depth_price(verify, draft, b, k))
            per_node = node_price(verify, draft, b, k)
            for name in policies:
                policy = make(name, priced, gates)
                results = [run_step(policy, s, k, config.draft_width, per_node) for s in trace]
                rows.append(Row(b, label, k, name, summarize(results, b, verify, draft)))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    head = (
        f"{'B':>4} {'K':>10} {'policy':<12} {'acc':>8} {'verif':>8} {'MAT':>5} {'yield':>6} "
        f"{'tok/s':>9} {'vs plain':>8} {'select':>7} {'cover':>8} {'sched ms':>8}"
    )
    lines = [head, "-" * len(head)]
    plain = {(r.batch_size, r.budget): r.summary.tokens_per_s for r in rows if r.policy == "plain"}
    for r in rows:
        s = r.summary
        base = plain.get((r.batch_size, r.budget), 0.0)
        lines.append(
            f"{r.batch_size:>4} {r.budget_label + '=' + str(r.budget):>10} {r.policy:<12} "
            f"{s.accepted:>8.1f} {s.verified:>8.1f} {s.mat:>5.2f} {s.draft_yield:>6.3f} "
            f"{s.tokens_per_s:>9.0f} {s.tokens_per_s / base if base else 0.0:>8.3f} "
            f"{s.selection:>7.3f} {s.coverage:>8.3f} {s.schedule_ms:>8.2f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The synthetic comparison, or with ``--traces`` the replay of recorded pools
    (:mod:`echo_lab.replay.cli`)."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--traces" or a.startswith("--traces=") for a in args_in):
        return replay_main(args_in)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workload", choices=["llama", "qwen"], default="llama")
    parser.add_argument("--context", type=int, default=2048, help="mean context for the roofline")
    parser.add_argument("--policies", nargs="+", default=list(POLICY_NAMES))
    parser.add_argument("--json", default=None, help="also write every row to this file")
    args = parser.parse_args(args_in)
    torch.set_num_threads(1)
    workload = SyntheticWorkload.llama() if args.workload == "llama" else SyntheticWorkload.qwen()
    geometry = ModelGeometry.llama31_8b()
    verify_for = {
        b: VerifyCostModel.roofline(Hardware.h200(), geometry, b, args.context)
        for b in args.batch_sizes
    }
    rows = simulate(
        workload,
        args.batch_sizes,
        args.steps,
        args.seed,
        verify_for,
        DraftCostModel(),
        args.policies,
    )
    print(
        f"workload={args.workload} steps={args.steps} seed={args.seed} cost=roofline "
        f"H200 Llama-3.1-8B ctx={args.context}"
    )
    print(format_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([{**asdict(r), "summary": asdict(r.summary)} for r in rows], fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
