"""Does a request's depth-1 draft quality persist from one of its decode steps to the next?

A per-request gate before drafting (skip the root of a request that will not pass the cost
floor, so its head rows are never run) needs a signal known before the step's drafter call: the
request's own past. This script measures, on recorded traces (``echo-trace/1`` with request ids),
how well two such signals predict whether the request's best depth-1 draft is accepted at its
next step:

- ``q_prev``: the best depth-1 draft probability ``q = exp(max draft_logprob)`` at the request's
  previous step, against this step's acceptance;
- ``ema``: an exponential moving average (weight ``alpha``) of the request's depth-1 acceptance
  over all its earlier steps, ``e <- e + alpha (a - e)``, started at its first step's ``a``.

For each it prints the Pearson correlation with this step's acceptance (0/1) and P(accepted) per
bin of the signal. Only consecutive steps of one request count for ``q_prev``.

    .venv/bin/python packages/echo-scheduler/scripts/request_persistence.py traces/trace-*.json.gz
"""

from __future__ import annotations

import argparse
import collections
import itertools
from dataclasses import dataclass

import torch

from echo_scheduler.trace import RecordedStep, load_trace


@dataclass(frozen=True, slots=True)
class Sample:
    """One request's step: its decode step number, best depth-1 q, and whether that draft was
    the target's next token."""

    step: int
    q: float
    accepted: bool


def samples(steps: list[RecordedStep]) -> dict[str, list[Sample]]:
    """Per request id, its steps in decode order."""
    out: dict[str, list[Sample]] = collections.defaultdict(list)
    for s in steps:
        if s.requests is None or s.request_steps is None:
            raise SystemExit("the trace has no request ids (recorded before echo-trace/1 had them)")
        pool = s.pool
        req = pool.request_index()
        first = pool.depth == 1
        for b, name in enumerate(s.requests):
            mask = first & (req == b)
            if not bool(mask.any()):
                continue
            lp = pool.draft_logprob[mask]
            best = int(lp.argmax())
            hit = int(pool.token[mask][best]) == int(s.target[b, 0])
            out[name].append(Sample(s.request_steps[b], float(lp[best].exp()), hit))
    for xs in out.values():
        xs.sort(key=lambda x: x.step)
    return out


def report(name: str, signal: list[float], hits: list[bool], edges: list[float]) -> None:
    """Correlation of ``signal`` with ``hits`` and P(hit) per bin ``[edges[i], edges[i+1])``."""
    x = torch.tensor(signal, dtype=torch.float64)
    y = torch.tensor(hits, dtype=torch.float64)
    corr = float(torch.corrcoef(torch.stack([x, y]))[0, 1])
    print(f"  {name}: n={x.numel()} corr={corr:.3f} P(accepted)={float(y.mean()):.3f}")
    for lo, hi in itertools.pairwise(edges):
        m = (x >= lo) & (x < hi)
        if bool(m.any()):
            share = float(y[m].mean())
            print(f"    [{lo:.2f}, {hi:.2f}): n={int(m.sum())} P(accepted)={share:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--alpha", type=float, default=0.3, help="EMA weight of the newest step")
    args = ap.parse_args()
    if not 0.0 < args.alpha <= 1.0:
        ap.error(f"--alpha must be in (0, 1], got {args.alpha}")
    edges = [0.0, 0.15, 0.3, 0.5, 0.7, 1.0 + 1e-9]
    for path in args.traces:
        per_request = samples(load_trace(path))
        q_prev: list[float] = []
        q_hits: list[bool] = []
        ema_prev: list[float] = []
        ema_hits: list[bool] = []
        for xs in per_request.values():
            ema: float | None = None
            for prev, cur in zip([None, *xs], xs, strict=False):
                if prev is not None and cur.step == prev.step + 1:
                    q_prev.append(prev.q)
                    q_hits.append(cur.accepted)
                if ema is not None:
                    ema_prev.append(ema)
                    ema_hits.append(cur.accepted)
                a = float(cur.accepted)
                ema = a if ema is None else ema + args.alpha * (a - ema)
        print(f"{path}: {len(per_request)} requests")
        report("q at the previous step", q_prev, q_hits, edges)
        report(f"acceptance EMA (alpha {args.alpha})", ema_prev, ema_hits, edges)


if __name__ == "__main__":
    main()
