"""Measure this CPU's step costs for the replay's ``cpu`` cost model (an echo-cpu-cost/1 file).

Verify: for every B in ``--batches`` and r in ``--draft-rows``, B requests with a cached context
of ``--context`` tokens each verify a chain of r draft rows (``B (1 + r)`` rows): the median of
passes of the embedded target's forward + logits, called as the engine calls it
(``echo_server.engine.profile.time_verify``), then made non-decreasing in rows (running maximum):
timing noise can make a pass over more rows measure faster, and the replay's oracle bound
relies on more rows never costing less. The points are measured in ``--rounds`` interleaved
rounds (every (B, r) once per round, the order rotated round by round, ``--repeats`` passes
each; a point's value is the median of its rounds' medians), so a machine that drifts during
the run shifts every point alike instead of distorting the profile's shape.

Draft: the engine with the ``global-topk`` policy (full-depth drafting, the policy the traces
were recorded with) and the shipped EAGLE head serves the first ``--prompts`` MT-Bench prompts at
concurrency 1; per decode step the drafter's seconds (the draft phase minus the policy's own
scheduling time) are fitted by least squares, without intercept and both coefficients >= 0, to
``c_call * calls + c_node * expansions``.

Drift check: a reference pass (B = 1, no draft row, the same context) is timed before the verify
grid, between the grid and the drafter run, and after it. A shared VM can change speed within
minutes (on the dev VM a fixed 1-row sweep took 13.4 ms, then 18.9 ms ten minutes later, then
13.6 ms again), and a profile measured across such a change has the wrong shape, so the file is
written only when the slowest reference is at most ``--max-drift`` times the fastest (default
1.10); the three references and their ratio are stored in the file's ``machine`` section.

One torch thread, as the benchmarks use. Run on a quiet machine:

    .venv/bin/python scripts/measure_cpu_cost.py --out traces/cost-cpu.json
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch

from echo_core.sampling import SamplingParams
from echo_lab.bench.intervals import cpu_name
from echo_lab.bench.workloads import load_workloads
from echo_lab.replay.costs import load_profiled, save_profiled
from echo_server.cli import build_parser
from echo_server.cli.options import build_engine, load
from echo_server.engine import GenerationRequest
from echo_server.engine.profile import time_verify
from echo_server.model.loader import LoadedModel


def fit_draft(samples: list[tuple[int, int, float]]) -> tuple[float, float]:
    """Least squares ``s ~ a calls + b expansions`` with a, b >= 0 (one pinned at 0 if needed)."""
    x = torch.tensor([[c, e] for c, e, _ in samples], dtype=torch.float64)
    y = torch.tensor([s for _, _, s in samples], dtype=torch.float64)
    coef = torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1)
    if coef.min() < 0:
        keep = 0 if coef[1] < 0 else 1
        one = torch.linalg.lstsq(x[:, keep : keep + 1], y.unsqueeze(1)).solution.squeeze()
        coef = torch.zeros(2, dtype=torch.float64)
        coef[keep] = one.clamp(min=0)
    return float(coef[0]), float(coef[1])


def draft_samples(
    args: argparse.Namespace, loaded: LoadedModel, n_prompts: int
) -> list[tuple[int, int, float]]:
    ns = build_parser().parse_args(["serve", "--threads", "1", "--drafter", "eagle"])
    engine = build_engine(loaded, "global-topk", ns)
    prompts = load_workloads(["mtbench"], n_prompts)[0].prompts
    out: list[tuple[int, int, float]] = []
    for p in prompts:
        params = SamplingParams(max_tokens=args.max_tokens)
        engine.submit(GenerationRequest(p.prompt_id, prompt=p.text, chat=p.chat, params=params))
        while engine.has_work():
            report = engine.step()
            for ev in report.events:
                if ev.finish_reason is not None:
                    engine.pop_finished(ev.request_id)
            for vs in report.passes:
                d = vs.driven
                seconds = report.phase_s.get("draft", 0.0) - d.schedule_s
                if d.depths > 0 and seconds > 0:
                    out.append((d.depths, d.expansions, seconds))
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--draft-rows", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="timed passes per point and round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median of medians)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--max-drift", type=float, default=1.10, help="slowest / fastest reference")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    ns = build_parser().parse_args(["serve", "--threads", "1"])
    loaded = load(ns)
    model = loaded.model

    def reference_pass() -> float:
        return time_verify(model, 1, 0, args.context, 5 * args.repeats)

    reference = [reference_pass()]
    verify: dict[int, tuple[list[float], list[float]]] = {}
    points = [(b, r) for b in args.batches for r in args.draft_rows]
    timed: dict[tuple[int, int], list[float]] = {pt: [] for pt in points}
    for k in range(args.rounds):
        shift = k * len(points) // max(args.rounds, 1)
        for b, r in points[shift:] + points[:shift]:
            timed[(b, r)].append(time_verify(model, b, r, args.context, args.repeats))
    for b in args.batches:
        rows = [float(b * (1 + r)) for r in args.draft_rows]
        raw = [sorted(timed[(b, r)])[len(timed[(b, r)]) // 2] for r in args.draft_rows]
        secs = [max(raw[: i + 1]) for i in range(len(raw))]
        verify[b] = (rows, secs)
        cells = ", ".join(f"{int(t)}:{1e3 * s:.1f}ms" for t, s in zip(rows, secs, strict=True))
        print(f"verify B={b}: {cells}")
    reference.append(reference_pass())
    samples = draft_samples(args, loaded, args.prompts)
    per_call, per_node = fit_draft(samples)
    print(
        f"draft: {len(samples)} steps, {1e3 * per_call:.3f} ms/call + {1e3 * per_node:.4f} ms/node"
    )
    reference.append(reference_pass())
    drift = max(reference) / min(reference)
    refs = ", ".join(f"{1e3 * s:.1f}" for s in reference)
    print(f"reference B=1 pass: {refs} ms; drift {drift:.3f}")
    if drift > args.max_drift:
        print(
            f"the machine changed speed during the measurement (drift {drift:.3f} > "
            f"{args.max_drift}): {args.out} not written; rerun when it is quiet",
            file=sys.stderr,
        )
        return 1
    machine = {
        "cpu": cpu_name(),
        "threads": 1,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "context": args.context,
        "draft_steps": len(samples),
        "model": "embedded default (SmolLM2-135M-Instruct, float32) + shipped EAGLE head",
        "reference_ms": [round(1e3 * s, 2) for s in reference],
        "drift": round(drift, 4),
    }
    save_profiled(args.out, verify, per_call, per_node, machine)
    load_profiled(args.out)  # the file reads back
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
