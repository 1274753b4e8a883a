"""Each gate arm of a replay JSON against ECHO without gates (``echo_nogate``), per model
family (cpu, Llama-3.1-8B, Qwen3-235B): the median and range of the tokens/s ratio over the
cells, and in how many cells the paired 95% interval against ``echo`` lies above / below 1
(``echo`` equals ``echo_nogate`` in every cell of these traces: the sparse gate calibrates no
checkpoint). Then the cells where an arm gains >= 3% with its interval above 1.

    python docs/bench/2026-12-04/gates/summary.py REPLAY.json[.gz] ARM...
"""

from __future__ import annotations

import statistics
import sys

from echo_scheduler.replay.report import load_replay, replay_cells

FAMILIES = {"cpu": "cpu", "llama": "llama8b", "qwen": "qwen235b"}


def main(path: str, arms: list[str]) -> None:
    cells = replay_cells(load_replay(path))  # keyed (cost model, trace, B)
    for arm in arms:
        for fam, tag in FAMILIES.items():
            group = [c for (cost, _, _), c in cells.items() if tag in cost]
            v = [c[arm]["tokens_per_s"] / c["echo_nogate"]["tokens_per_s"] for c in group]
            above = sum(c[arm]["ratio_ci95"][0] > 1 for c in group)
            below = sum(c[arm]["ratio_ci95"][1] < 1 for c in group)
            print(
                f"{arm:<20} {fam:<6} median {statistics.median(v):.3f} "
                f"[{min(v):.3f}, {max(v):.3f}]  interval above 1: {above:>2}, below: {below:>2} "
                f"of {len(v)}"
            )
    print("\ncells with a gain >= 3% and the interval above 1:")
    for (cost, trace, batch), c in cells.items():
        for arm in arms:
            r = c[arm]
            if r["ratio_ci95"][0] > 1 and r["ratio_vs_echo"] >= 1.03:
                lo, hi = r["ratio_ci95"]
                cell = (trace, cost, batch)
                print(f"  {cell!s:<40} {arm:<20} {r['ratio_vs_echo']:.3f} [{lo:.3f}, {hi:.3f}]")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
