"""Markdown tables of a replay (``echo-sd sim --traces ... --markdown OUT``).

One table per cost model, one line per (trace, B): plain decoding's rate, ECHO's speedup over
it, the best fixed baseline (the best point of the chain, static and EAGLE-2 grids, chosen in
hindsight on the same steps, so its interval is optimistic for the baseline) and ECHO's ratio
to it with the paired 95% interval, ECHO with per-request history (with its interval), ECHO
without its ledger and the gate variants as ratios to ECHO (``utility``: the gate
chosen by simulated net utility on warm-up steps, with its choice), eta of ECHO and of that
baseline, and, when the steps are request streams, the per-request tails of ECHO and of that
baseline (replay.fairness: 10th-percentile per-request speedup over plain decoding; longest run
of steps a request verified no draft row while its batch verified some).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from echo_lab.replay.arms import GRID_FAMILIES


def load_replay(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a replay JSON (``echo-sd sim --json``; gzip-compressed when it ends in
    ``.gz``)."""
    raw = Path(path).read_bytes()
    data = json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
    rows: list[dict[str, Any]] = data["rows"]
    return rows


def replay_cells(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """The rows per (cost model, trace, B) cell, keyed by arm, in the rows' order."""
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in rows:
        out.setdefault((r["cost_model"], r["trace"], r["batch"]), {})[r["arm"]] = r
    return out


def _vs(arms: dict[str, Any], name: str) -> str:
    return f"{arms[name]['ratio_vs_echo']:.3f}" if name in arms else "-"


def _with_ci(arms: dict[str, Any], name: str) -> str:
    row = arms.get(name)
    if row is None:
        return "-"
    lo, hi = row["ratio_ci95"]
    return f"{row['ratio_vs_echo']:.3f} [{lo:.3f}, {hi:.3f}]"


def _tail(echo: dict[str, Any], best: dict[str, Any]) -> str:
    if echo.get("request_speedup_p10") is None or best.get("request_speedup_p10") is None:
        return "- | -"
    return (
        f"{echo['request_speedup_p10']:.2f} / {best['request_speedup_p10']:.2f} | "
        f"{echo['starved_max']} / {best['starved_max']}"
    )


def _utility(arms: dict[str, Any]) -> str:
    row = arms.get("echo_utility")
    return "-" if row is None else f"{row['ratio_vs_echo']:.3f} ({row['gate_choice']})"


def markdown_tables(rows: Sequence[dict[str, Any]]) -> str:
    lines: list[str] = []
    cells = replay_cells(rows)
    for cost in dict.fromkeys(k[0] for k in cells):
        lines += [
            f"\n**{cost}**\n",
            "| trace | B | plain tok/s | ECHO x plain | best fixed | ECHO / best [95% CI] "
            "| history [95% CI] | no ledger | no gate | dense | fixed | 2 checkpoints "
            "| 2, next labels "
            "| utility (choice) "
            "| eta ECHO | eta best | request p10 ECHO / best | starved ECHO / best |",
            "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
        ]
        for (c, trace, b), arms in cells.items():
            if c != cost or "echo" not in arms:
                continue
            echo = arms["echo"]
            best = max(
                (arms[f"{f}*"] for f in GRID_FAMILIES if f"{f}*" in arms),
                key=lambda r: r["tokens_per_s"],
                default=None,
            )
            if best is None:
                continue
            lo, hi = best["ratio_ci95"]  # best / echo: invert for echo / best
            if min(lo, best["ratio_vs_echo"]) <= 0:
                continue  # ECHO emitted nothing: no ratio to show

            lines.append(
                f"| {trace} | {b} | {arms['plain']['tokens_per_s']:,.0f} | "
                f"{echo['vs_plain']:.2f} | {best['best_of']} | "
                f"{1 / best['ratio_vs_echo']:.3f} [{1 / hi:.3f}, {1 / lo:.3f}] | "
                f"{_with_ci(arms, 'echo_history')} | {_vs(arms, 'echo_noledger')} | "
                f"{_vs(arms, 'echo_nogate')} | {_vs(arms, 'echo_dense')} | "
                f"{_vs(arms, 'echo_fixed')} | {_vs(arms, 'echo_k2')} | "
                f"{_vs(arms, 'echo_next_k2')} | {_utility(arms)} | "
                f"{echo['eta']:.2f} | {best['eta']:.2f} | {_tail(echo, best)} |"
            )
    return "\n".join(lines)
