"""Why do fixed one-call trees with ECHO's floor match or beat ECHO at B = 256? ECHO's three
online decisions switched off one at a time, replayed beside the floored fixed trees (a one-off
experiment, not arms of the default replay):

- ``echo_noledger``: no draft ledger / mode chooser (an arm of the default replay);
- ``echo_noumin``: no ``u' >= u_min`` eligibility filter, so the exact cut alone decides which
  rows pay (``_eligible`` without the floor); ``echo_noumin_noledger`` both;
- ``echo_d1_noledger`` / ``echo_d1_noumin``: ECHO held to depth 1 (``max_depth = base_depth = 1``)
  without the ledger / without the filter.

Runs in one process (``--jobs 1``) so that the patched policy constructor reaches every cell.

    .venv/bin/python docs/bench/2026-12-04/depth/echo_variants.py --json OUT.json
    python docs/bench/2026-12-04/depth/summary.py OUT.json
"""

from __future__ import annotations

import sys
from dataclasses import replace

from torch import Tensor

from echo_gating.policy import GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.interface import Policy
from echo_scheduler.policies import make_policy
from echo_scheduler.policies.echo import EchoPolicy
from echo_scheduler.replay import cli
from echo_scheduler.replay import run as replay_run
from echo_scheduler.replay.arms import ECHO_PER_REQUEST, Arm

FLOORED = ["chain/n=1+floor", "static/2+floor", "chain/n=2+floor"]
VARIANTS = ["echo_noumin", "echo_noumin_noledger", "echo_d1_noledger", "echo_d1_noumin"]
_optional_arms = cli.optional_arms


class NoFloorFilter(EchoPolicy):
    """ECHO whose eligibility ignores the floor ``u_min`` (the exact cut still prices rows)."""

    def _eligible(self, depth: Tensor | int, req: Tensor, key: Tensor) -> Tensor:
        return self.truncated_at.index_select(0, req) >= depth


def policy_for(
    name: str, config: PolicyConfig | None = None, gate: GatePolicy | None = None
) -> Policy:
    if name.startswith("echo_noumin"):
        cfg = config or PolicyConfig()
        return NoFloorFilter(cfg, gate, name=name, learn_drafting="noledger" not in name)
    return make_policy(name, config, gate)


def optional_arms(base: PolicyConfig | None = None) -> list[Arm]:
    cfg = base or PolicyConfig.high_concurrency()
    d1 = replace(cfg, base_depth=1, max_depth=1)
    per = ECHO_PER_REQUEST
    return [
        *_optional_arms(base),
        Arm("echo_noumin", "echo_noumin", "echo_noumin", cfg, per, True, "echo", True),
        Arm("echo_noumin_noledger", "echo_noumin_noledger", "echo_noumin_noledger", cfg, per,
            True, "echo", True),
        Arm("echo_d1_noledger", "echo_d1_noledger", "echo_noledger", d1, per, True, "echo", True),
        Arm("echo_d1_noumin", "echo_d1_noumin", "echo_noumin", d1, per, True, "echo", True),
    ]  # fmt: skip


if __name__ == "__main__":
    replay_run.make_policy = policy_for  # type: ignore[assignment]
    cli.optional_arms = optional_arms  # type: ignore[assignment]
    argv = ["--traces", "traces/trace-humaneval.json.gz", "traces/trace-mtbench.json.gz",
            "traces/trace-summarize.json.gz", "--jobs", "1",
            "--arms", "echo_noledger", *VARIANTS, *FLOORED, *sys.argv[1:]]  # fmt: skip
    sys.exit(cli.main(argv))
