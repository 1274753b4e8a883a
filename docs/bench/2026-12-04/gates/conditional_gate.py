"""A two-checkpoint sparse gate calibrated on the conditional label, replayed beside the other
gates (a one-off experiment, not an arm of the default replay).

``echo_cond_k2``: like ``echo_next_k2`` (two checkpoints, the best two depths by the AUC's lower
bound, utility thresholds at cost ratio 0.5, the same acceptance maps and warm-up records), with
``label_rule="conditional"``: checkpoints and thresholds judge ``P(L >= d + 1 | L >= d)``, what a
gate at d decides (echo_gating.layerwise). ``echo_cond_k2_slack``: the same with the slack rule.

    .venv/bin/python docs/bench/2026-12-04/gates/conditional_gate.py --json OUT.json
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from echo_gating.calibrate import CalibrationConfig, calibrate
from echo_gating.policy import GateMode, GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.replay import cli
from echo_scheduler.replay.arms import ECHO_PER_REQUEST, Arm
from echo_scheduler.replay.gates import MAP_BINS, warmup_records
from echo_scheduler.replay.run import WARMUP_CHUNK
from echo_scheduler.rows import TraceRow, stack

ARMS = ["echo_nogate", "echo_next_k2", "echo_next_k2_slack", "echo_cond_k2", "echo_cond_k2_slack"]
_calibrate_rows = cli.calibrate_rows
_optional_arms = cli.optional_arms


def calibrate_rows(rows: Sequence[TraceRow], max_depth: int) -> dict[str, GatePolicy]:
    gates = _calibrate_rows(rows, max_depth)
    steps = [stack(rows[i : i + WARMUP_CHUNK]) for i in range(0, len(rows), WARMUP_CHUNK)]
    cfg = CalibrationConfig(
        mode=GateMode.SPARSE,
        max_depth=max_depth,
        cost_ratio=0.5,
        map_bins=MAP_BINS,
        label_rule="conditional",
        num_checkpoints=2,
    )
    gates["echo_cond_k2"] = gate = calibrate(warmup_records(steps), cfg)
    print(f"echo_cond_k2: checkpoints {gate.checkpoints}, thresholds {dict(gate.thresholds)}")
    return gates


def optional_arms(base: PolicyConfig | None = None) -> list[Arm]:
    cfg = base or PolicyConfig.high_concurrency()
    per = ECHO_PER_REQUEST
    return [
        *_optional_arms(base),
        Arm("echo_cond_k2", "echo_cond_k2", "echo", cfg, per, True, "echo_cond_k2", True),
        Arm("echo_cond_k2_slack", "echo_cond_k2_slack", "echo_slack", cfg, per, True,
            "echo_cond_k2", True),
    ]  # fmt: skip


if __name__ == "__main__":
    cli.calibrate_rows = calibrate_rows  # type: ignore[assignment]
    cli.optional_arms = optional_arms  # type: ignore[assignment]
    argv = ["--traces", "traces/trace-humaneval.json.gz", "traces/trace-mtbench.json.gz",
            "traces/trace-summarize.json.gz", "--arms", *ARMS, *sys.argv[1:]]  # fmt: skip
    sys.exit(cli.main(argv))
