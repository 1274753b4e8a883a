"""Test isolation for the whole repository.

A CLI test runs ``configure_logging`` (echo_controller.logs), which sets structlog's process-wide
configuration, its level filter included. ``structlog.testing.capture_logs`` replaces only the
processors, so a later test that captures an ``info`` event would see nothing after a CLI test
ran at ``--log-level warning``. Every test therefore starts from structlog's defaults.

Every test also starts with one torch intra-op thread (where torch is installed: echo-controller
and echo-proto test without it). On the shared 2-core machines two OpenMP threads stall whenever
another process holds a core (a 24-token greedy run of SmolLM2 measured 2 s with one thread and
19-38 s with two), so a suite run with two threads takes as long as the machine's neighbours
let it; a test that wants more threads (a CLI's ``--threads``) sets them itself.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
import structlog

TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def _one_torch_thread() -> None:
    if TORCH:
        import torch

        torch.set_num_threads(1)
