"""The policy driver loop exists once per layout: only echo_scheduler.driver calls a policy's
``after_depth`` (the engine, the simulator and the SGLang replay all go through it), and only
echo_scheduler.device.driver its ``fixed_depth`` (the fixed layout's drafters)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "packages/echo-scheduler/src/echo_scheduler/driver.py"
FIXED_DRIVER = ROOT / "packages/echo-scheduler/src/echo_scheduler/device/driver.py"


def _calls(path: Path, method: str) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == method
    ]


def _only_caller(driver: Path, method: str, starts: str) -> dict[str, list[int]]:
    """Files other than ``driver`` that call ``method``; ``driver`` must call it and ``starts``."""
    sources = sorted(ROOT.glob("packages/*/src/**/*.py"))
    assert driver in sources
    assert _calls(driver, method)
    assert _calls(driver, starts)
    return {
        str(p.relative_to(ROOT)): lines
        for p in sources
        if p != driver and (lines := _calls(p, method))
    }


def test_only_the_driver_runs_the_draft_loop() -> None:
    offenders = _only_caller(DRIVER, "after_depth", "begin_step")
    assert offenders == {}, f"a second draft-and-select loop: {offenders}"


def test_only_the_fixed_driver_runs_the_fixed_layout_loop() -> None:
    offenders = _only_caller(FIXED_DRIVER, "fixed_depth", "begin_fixed")
    assert offenders == {}, f"a second fixed-layout loop: {offenders}"
