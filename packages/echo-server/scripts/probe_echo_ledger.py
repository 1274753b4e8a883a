"""ECHO's ledger prices against the step times measured in the same run (a diagnostic).

Runs ECHO alone on one workload (one round, the embedded default engine) and records every
decode step over a full batch (no prefill in it): whether the step was drafted, its accepted
drafts A, verified rows N, the ledger's prices of its rows and drafting (tokens, and seconds at
the run rate R), its measured verify and draft-phase seconds. Prints, for the drafted steps,
the priced row and drafting seconds against the measured excess over the undrafted steps'
medians, and the value per drafted step as the ledger saw it (``A - c_rows - c_draft``) and at
the measured times and the undrafted steps' own rate. The measured excess is confounded: drafted
and undrafted steps run at different points of the requests' lives (context lengths), so it is
a check on the prices' size, not a price.

    .venv/bin/python packages/echo-server/scripts/probe_echo_ledger.py --workload humaneval \\
        --concurrency 8 --num-prompts 16
"""

from __future__ import annotations

import argparse
import statistics as st
from typing import Any

import torch

from echo_scheduler.interface import StepOutcome
from echo_scheduler.policies.echo import EchoPolicy
from echo_server.bench.suite import SuiteSpec, run_suite
from echo_server.bench.workloads import load_workloads
from echo_server.cli import build_parser
from echo_server.cli.bench import _factory
from echo_server.cli.options import load
from echo_server.engine import Engine
from echo_server.engine.report import StepReport


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--workload", default="humaneval")
    p.add_argument("--num-prompts", type=int, default=16)
    a = p.parse_args()
    rows: list[dict[str, Any]] = []
    cur: dict[str, Any] = {}
    observe, step = EchoPolicy.observe, Engine.step

    def recording(self: EchoPolicy, outcome: StepOutcome) -> None:
        b = self._batch
        cur.clear()
        if b is not None and b.row_price is not None:
            n = int(outcome.verified.sum())
            cur.update(
                B=b.batch_size,
                drafted=bool(self._roots),
                shallow=self._shallow,
                A=int(outcome.accepted_lengths.sum()),
                N=n,
                R=b.row_price.rate,
                row_tok=self._row_cost(b, n),
                draft_tok=self._draft_cost(b, outcome.draft_s) or 0.0,
                draft_s=outcome.draft_s or 0.0,
            )
        observe(self, outcome)

    def timed(self: Engine) -> StepReport:
        report = step(self)
        if cur and "prefill" not in report.phase_s:
            rows.append({**cur, "verify_s": report.phase_s.get("verify", 0.0)})
        cur.clear()
        return report

    EchoPolicy.observe = recording  # type: ignore[method-assign]
    Engine.step = timed  # type: ignore[method-assign]
    torch.set_num_threads(1)
    argv = ["bench", "--threads", "1", "--max-tokens", "64", "--workloads", a.workload]
    args = build_parser().parse_args(argv)
    workloads = load_workloads([a.workload], a.num_prompts, None)
    make = _factory(load(args), args, workloads)
    spec = SuiteSpec(("echo",), (a.concurrency,), 64, rounds=1)
    run_suite(make, workloads, spec, progress=False)
    _report(a.workload, a.concurrency, [r for r in rows if r["B"] == a.concurrency])


def _report(workload: str, conc: int, full: list[dict[str, Any]]) -> None:
    plain = [r for r in full if not r["drafted"]]
    drafted = [r for r in full if r["drafted"]]
    print(f"{workload} c={conc}: {len(full)} decode steps over {conc} requests, "
          f"{len(plain)} undrafted, {len(drafted)} drafted")  # fmt: skip
    if not plain or not drafted:
        return
    vp = st.median(r["verify_s"] for r in plain)
    d0 = st.median(r["draft_s"] for r in plain)
    rate = conc / (vp + d0)
    led = st.median(r["R"] for r in drafted)
    print(f"  undrafted: verify median {1e3 * vp:.1f} ms, draft phase {1e3 * d0:.2f} ms, "
          f"{rate:.1f} tok/s; the ledger's R median {led:.1f}")  # fmt: skip
    for key in ("A", "N"):
        print(f"  {key} per drafted step: mean {st.fmean(r[key] for r in drafted):.2f}")
    for sub, name in ((drafted, "all"), *((
        [r for r in drafted if r["shallow"] == s], "depth 1 only" if s else "full"
    ) for s in (False, True))):  # fmt: skip
        if not sub:
            continue
        priced_rows = st.fmean(r["row_tok"] / r["R"] for r in sub)
        measured_rows = st.fmean(r["verify_s"] - vp for r in sub)
        priced_draft = st.fmean(r["draft_tok"] / r["R"] for r in sub)
        measured_draft = st.fmean(r["draft_s"] - d0 for r in sub)
        ledger = st.fmean(r["A"] - r["row_tok"] - r["draft_tok"] for r in sub)
        timed = st.fmean(r["A"] - rate * (r["verify_s"] - vp + r["draft_s"] - d0) for r in sub)
        print(f"  {name} ({len(sub)} steps): rows priced {1e3 * priced_rows:.1f} ms, measured "
              f"{1e3 * measured_rows:.1f}; drafting priced {1e3 * priced_draft:.1f} ms, measured "
              f"{1e3 * measured_draft:.1f}; value per step: ledger {ledger:.2f} tokens, at "
              f"measured times {timed:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
