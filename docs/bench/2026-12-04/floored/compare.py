"""ECHO against the best fixed tree, and against the best fixed tree offered ECHO's floor, per
replay cell (each family's best grid point chosen in hindsight, as the replay's report does).

    python docs/bench/2026-12-04/floored/compare.py docs/bench/2026-12-04/floored/replay.json.gz

The replay (AMD EPYC VM, 53 s):

    .venv/bin/echo-sd sim --traces traces/trace-*.json.gz --json replay.json \\
        --arms chain static eagle2 chain+floor static+floor eagle2+floor
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

from echo_scheduler.replay.report import load_replay, replay_cells

FIXED = ("chain", "static", "eagle2")
FLOORED = tuple(f"{f}+floor" for f in FIXED)


def _best(cell: dict[str, Any], families: tuple[str, ...]) -> dict[str, Any]:
    return max(
        (r for r in cell.values() if r["family"] in families), key=lambda r: r["tokens_per_s"]
    )


def main(path: str) -> None:
    cells = replay_cells(load_replay(path))  # keyed (cost model, trace, B)
    print(
        f"{'cost model':<22}{'B':>4} {'trace':<10} {'best fixed':>14} {'best fixed+floor':>20} "
        f"{'ECHO / fixed':>12} {'ECHO / fixed+floor [95% CI]':>28}"
    )
    gains, at256 = [], []
    for (cm, t, b), c in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        e, fixed, floored = c["echo"], _best(c, FIXED), _best(c, FLOORED)
        lo, hi = floored["ratio_ci95"]  # floored / ECHO
        r1 = e["tokens_per_s"] / fixed["tokens_per_s"]
        r2 = e["tokens_per_s"] / floored["tokens_per_s"]
        gains.append(floored["tokens_per_s"] / fixed["tokens_per_s"])
        if b == 256:
            at256.append((r1, r2))
        print(
            f"{cm:<22}{b:>4} {t:<10} {fixed['arm']:>14} {floored['arm']:>20} {r1:>12.3f} "
            f"{r2:>10.3f} [{1 / hi:.3f}, {1 / lo:.3f}]"
        )
    print(
        f"\nthe floor on the best fixed tree: median {statistics.median(gains):.3f}, "
        f"range {min(gains):.3f}-{max(gains):.3f}"
    )
    plain = [a for a, _ in at256]
    floor = [b for _, b in at256]
    print(
        f"B = 256: ECHO / best fixed {min(plain):.3f}-{max(plain):.3f}; "
        f"ECHO / best fixed with the floor {min(floor):.3f}-{max(floor):.3f}"
    )


if __name__ == "__main__":
    main(sys.argv[1])
