"""Print the replay's CPU rows: ECHO and the best fixed arm per (trace, B), from an echo-sim JSON.

Usage: ``python cpu_rows.py docs/sim-replay.json``. "Best fixed" is the highest tokens/s among
the chain, static, EAGLE-2 and global-top-K grid points of that cell (chosen in hindsight).
"""

from __future__ import annotations

import json
import sys
from typing import Any

FIXED = ("chain", "static", "eagle2", "global_topk")


def main(path: str) -> None:
    with open(path) as f:
        rows: list[dict[str, Any]] = [r for r in json.load(f)["rows"] if r["cost_model"] == "cpu"]

    def arm(trace: str, batch: int, name: str) -> dict[str, Any] | None:
        hits = [r for r in rows if (r["trace"], r["batch"], r["arm"]) == (trace, batch, name)]
        return hits[0] if hits else None

    for batch in sorted({r["batch"] for r in rows}):
        print(f"B={batch}")
        for trace in ("humaneval", "mtbench", "summarize"):
            echo = arm(trace, batch, "echo")
            fixed = [r for r in rows if (r["trace"], r["batch"]) == (trace, batch)]
            fixed = [r for r in fixed if r["family"] in FIXED]
            if echo is None or not fixed:
                continue
            best = max(fixed, key=lambda r: r["tokens_per_s"])
            line = (
                f"  {trace}: echo/plain {echo['vs_plain']:.2f} eta {echo['eta']:.2f} "
                f"cov {echo['coverage']:.2f} sel {echo['selection']:.2f} | best fixed "
                f"{best['arm']} {best['vs_plain']:.2f} eta {best['eta']:.2f} | echo/best "
                f"{echo['tokens_per_s'] / best['tokens_per_s']:.2f}"
            )
            noledger = arm(trace, batch, "echo_noledger")
            if noledger is not None:
                lo, hi = noledger["ratio_ci95"]
                line += f" | noledger/echo {noledger['ratio_vs_echo']:.2f} {lo:.2f}-{hi:.2f}"
            print(line)


if __name__ == "__main__":
    main(sys.argv[1])
