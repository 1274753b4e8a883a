"""The slack rule against strict truncation, per replay cell: each forced or ablation gate over
ECHO without gates (``echo_nogate``), strict -> with the slack rule; then medians and ranges.

    python docs/bench/2026-12-04/slack/compare.py docs/bench/2026-12-04/slack/replay.json.gz

The replay (AMD EPYC VM, 38 s):

    .venv/bin/echo-sd sim --traces traces/trace-*.json.gz --json replay.json --arms echo_nogate \\
        echo_k2 echo_k2_slack echo_next_k2 echo_next_k2_slack echo_dense echo_dense_slack \\
        echo_fixed echo_fixed_slack
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from typing import Any

GATES = ("echo_k2", "echo_next_k2", "echo_dense", "echo_fixed")


def main(path: str) -> None:
    with gzip.open(path) if path.endswith(".gz") else open(path, "rb") as f:
        rows = json.load(f)["rows"]
    cells: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in rows:
        cells.setdefault((r["trace"], r["cost_model"], r["batch"]), {})[r["arm"]] = r
    print(f"{'cell':<44} " + " ".join(f"{g:>14}" for g in GATES))
    slack_over_strict: dict[str, list[float]] = {g: [] for g in GATES}
    strict: dict[str, list[float]] = {g: [] for g in GATES}
    slack: dict[str, list[float]] = {g: [] for g in GATES}
    for key, c in cells.items():
        base = c["echo_nogate"]["tokens_per_s"]
        out = []
        for g in GATES:
            a, b = c[g]["tokens_per_s"], c[f"{g}_slack"]["tokens_per_s"]
            slack_over_strict[g].append(b / a)
            strict[g].append(a / base)
            slack[g].append(b / base)
            out.append(f"{a / base:.3f}->{b / base:.3f}")
        print(f"{key!s:<44} " + " ".join(f"{o:>14}" for o in out))
    for g in GATES:
        print(
            f"{g}: slack / strict median {statistics.median(slack_over_strict[g]):.4f} "
            f"[{min(slack_over_strict[g]):.3f}, {max(slack_over_strict[g]):.3f}] | "
            f"strict / nogate median {statistics.median(strict[g]):.4f} "
            f"[{min(strict[g]):.3f}, {max(strict[g]):.3f}] | "
            f"slack / nogate median {statistics.median(slack[g]):.4f} "
            f"[{min(slack[g]):.3f}, {max(slack[g]):.3f}]"
        )


if __name__ == "__main__":
    main(sys.argv[1])
