"""Shared fixtures of the replay tests: a small synthetic recording, saved like a real one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from echo_lab.sim.rows import TraceRow, load_rows
from echo_lab.sim.trace import RecordedStep, record, save_trace
from echo_scheduler.config import PolicyConfig
from echo_scheduler.workloads import SyntheticWorkload


def synthetic_steps(batch: int, steps: int, seed: int = 0) -> list[RecordedStep]:
    cfg = PolicyConfig.high_concurrency()
    g = torch.Generator().manual_seed(seed)
    return [record(s, cfg) for s in SyntheticWorkload.llama().sample(batch, steps, g)]


@pytest.fixture(scope="session")
def make_steps() -> Callable[[int, int, int], list[RecordedStep]]:
    return synthetic_steps


@pytest.fixture(scope="session")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("traces") / "trace-syn.json.gz"
    save_trace(synthetic_steps(8, 40), path)
    return path


@pytest.fixture(scope="session")
def rows(trace_file: Path) -> list[TraceRow]:
    return load_rows([trace_file])
