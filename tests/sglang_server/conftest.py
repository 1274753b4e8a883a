"""The SGLang server tier (``make test-sglang``): real ``sglang.launch_server`` processes on the
CPU, built by ``scripts/sglang/setup_env.sh`` (echo_lab.sglang.harness).

Servers start once per session and mode, on first use, and stop at the end; only the one in
use runs, the others are paused (SGLang's idle scheduler would take a core each). Without the
environment every test here skips, unless ``ECHO_SGLANG_REQUIRED=1`` (set by ``make test-sglang``,
which builds it first): then a missing environment is a failure. Server logs go to
``.cache/sglang-logs`` (kept for reading after a failure).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from echo_lab.sglang.harness import CACHE, Environment, Server, start_server

LOG_DIR = CACHE / "sglang-logs"


@pytest.fixture(scope="session")
def sglang_env() -> Environment:
    env = Environment.default()
    problem = env.problem()
    if problem is not None:
        if os.environ.get("ECHO_SGLANG_REQUIRED") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    return env


@pytest.fixture(scope="session")
def server(sglang_env: Environment) -> Iterator[Callable[[str], Server]]:
    """``server(mode)``: the session's running server of ``mode``, started on first use."""
    running: dict[str, Server] = {}

    def get(mode: str) -> Server:
        for other, s in running.items():
            if other != mode:
                s.pause()
        current = running.get(mode)
        if current is None or not current.alive():
            running[mode] = current = start_server(
                sglang_env, mode, LOG_DIR, extra_env={"ECHO_SGLANG_LOG_FEEDBACK": "1"}
            )
        current.resume()
        return current

    yield get
    for s in running.values():
        s.close()


@pytest.fixture(scope="session")
def log_dir() -> Path:
    return LOG_DIR
