"""Each ECHO variant of echo_variants.py over ECHO, and over the best of the three floored
one-and-two-node trees it ran, per batch size on the GPU cost models (median [range] over the
cells), then the CPU cells over ECHO.

    python docs/bench/2026-12-04/depth/summary.py REPLAY.json[.gz]
"""

from __future__ import annotations

import statistics
import sys

from echo_scheduler.replay.report import load_replay, replay_cells

FLOORED = ("chain/n=1+floor", "static/2+floor", "chain/n=2+floor")
ARMS = ("echo", "echo_noledger", "echo_noumin", "echo_noumin_noledger", "echo_d1_noledger",
        "echo_d1_noumin")  # fmt: skip


def _span(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def main(path: str) -> None:
    cells = replay_cells(load_replay(path))  # keyed (cost model, trace, B)
    for b in (16, 64, 256):
        gpu = [c for (cost, _, batch), c in cells.items() if batch == b and cost != "cpu"]
        for arm in ARMS:
            own = [c[arm]["tokens_per_s"] / c["echo"]["tokens_per_s"] for c in gpu]
            best = [
                c[arm]["tokens_per_s"] / max(c[a]["tokens_per_s"] for a in FLOORED) for c in gpu
            ]
            print(f"B={b:<4} {arm:<22} / echo {_span(own)}   / best floored {_span(best)}")
    cpu = [c for (cost, _, _), c in cells.items() if cost == "cpu"]
    for arm in ARMS[1:]:
        own = [c[arm]["tokens_per_s"] / c["echo"]["tokens_per_s"] for c in cpu]
        print(f"cpu    {arm:<22} / echo {_span(own)}")


if __name__ == "__main__":
    main(sys.argv[1])
