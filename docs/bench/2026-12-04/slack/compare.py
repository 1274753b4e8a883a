"""The slack rule against strict truncation, per replay cell: each forced or ablation gate over
ECHO without gates (``echo_nogate``), strict -> with the slack rule; then medians and ranges.

    python docs/bench/2026-12-04/slack/compare.py docs/bench/2026-12-04/slack/replay.json.gz

The replay (AMD EPYC VM, 38 s):

    .venv/bin/echo-sd sim --traces traces/trace-*.json.gz --json replay.json --arms echo_nogate \\
        echo_k2 echo_k2_slack echo_next_k2 echo_next_k2_slack echo_dense echo_dense_slack \\
        echo_fixed echo_fixed_slack
"""

from __future__ import annotations

import statistics
import sys

from echo_scheduler.replay.report import load_replay, replay_cells

GATES = ("echo_k2", "echo_next_k2", "echo_dense", "echo_fixed")


def main(path: str) -> None:
    cells = replay_cells(load_replay(path))  # keyed (cost model, trace, B)
    print(f"{'cell':<44} " + " ".join(f"{g:>14}" for g in GATES))
    slack_over_strict: dict[str, list[float]] = {g: [] for g in GATES}
    strict: dict[str, list[float]] = {g: [] for g in GATES}
    slack: dict[str, list[float]] = {g: [] for g in GATES}
    for (cost, trace, batch), c in cells.items():
        base = c["echo_nogate"]["tokens_per_s"]
        out = []
        for g in GATES:
            a, b = c[g]["tokens_per_s"], c[f"{g}_slack"]["tokens_per_s"]
            slack_over_strict[g].append(b / a)
            strict[g].append(a / base)
            slack[g].append(b / base)
            out.append(f"{a / base:.3f}->{b / base:.3f}")
        print(f"{(trace, cost, batch)!s:<44} " + " ".join(f"{o:>14}" for o in out))
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
