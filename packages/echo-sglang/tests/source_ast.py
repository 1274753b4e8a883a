"""Reading source files as syntax trees, for the contract tests of the worker (which imports
SGLang's CUDA worker, so it cannot be imported on a CPU) against SGLang's own source."""

from __future__ import annotations

import ast
from pathlib import Path

WORKER = Path(__file__).resolve().parents[1] / "src" / "echo_sglang" / "worker.py"
"""echo-sglang's worker module, read but never imported here."""


def function_def(path: Path, name: str) -> ast.FunctionDef:
    """The first function or method called ``name`` in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{path} defines no {name}")
