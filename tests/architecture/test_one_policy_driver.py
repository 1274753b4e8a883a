"""The policy driver loop exists once: only echo_scheduler.driver calls a policy's
``after_depth`` (the engine, the simulator and the SGLang replay all go through it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "packages/echo-scheduler/src/echo_scheduler/driver.py"


def _calls(path: Path, method: str) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == method
    ]


def test_only_the_driver_runs_the_draft_loop() -> None:
    sources = sorted(ROOT.glob("packages/*/src/**/*.py"))
    assert DRIVER in sources
    offenders = {
        str(p.relative_to(ROOT)): lines
        for p in sources
        if p != DRIVER and (lines := _calls(p, "after_depth"))
    }
    assert offenders == {}, f"a second draft-and-select loop: {offenders}"
    assert _calls(DRIVER, "after_depth")
    assert _calls(DRIVER, "begin_step")
