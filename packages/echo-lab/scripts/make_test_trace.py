"""Regenerate tests/data/small_trace.json: 3 recorded steps of 6 requests (seed 7, llama-like)."""

from __future__ import annotations

from pathlib import Path

import torch

from echo_lab.sim.trace import record, save_trace
from echo_scheduler.config import PolicyConfig
from echo_scheduler.workloads import SyntheticWorkload

CONFIG = PolicyConfig(max_depth=5, max_width=4)
OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "small_trace.json"


def main() -> None:
    steps = SyntheticWorkload.llama().sample(6, 3, torch.Generator().manual_seed(7))
    save_trace([record(s, CONFIG) for s in steps], OUT)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
