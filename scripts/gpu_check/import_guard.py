"""Refuse, in the dry run, every import from ECHO code that the GPU machine could not satisfy.

The GPU machine has torch, triton, transformers, grpcio and pytest with their own dependencies,
plus the wheels carried in ``scripts/gpu_wheels``. :func:`install` puts a finder first on
``sys.meta_path`` that raises ``ImportError`` when a module under ``packages/`` or ``scripts/``
(or ``tests/``) imports a top-level name outside the standard library, those distributions' closure
(``importlib.metadata`` requirements without extras), the carried wheels and ``echo_*``.
Third-party code keeps its own optional probes (torch looks for pydot, and so on).
Also a pytest plugin (``-p gpu_check.import_guard``): installed when pytest loads it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata as md
import re
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType, ModuleType

BASE = ("torch", "triton", "transformers", "grpcio", "pytest")
REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / "scripts" / "gpu_wheels"


def _closure(names: Sequence[str]) -> list[md.Distribution]:
    seen: dict[str, md.Distribution | None] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            seen[key] = None
            continue
        seen[key] = dist
        for req in dist.requires or []:
            match = re.match(r"[A-Za-z0-9_.\-]+", req)
            if match and "extra ==" not in req:
                todo.append(match.group(0))
    return [d for d in seen.values() if d is not None]


def _top_levels(dist: md.Distribution) -> set[str]:
    text = dist.read_text("top_level.txt")
    if text:
        return set(text.split())
    tops = set()
    for f in dist.files or []:
        first = str(f).split("/")[0]
        if first.endswith(".py"):
            tops.add(first[:-3])
        elif "." not in first and first != "__pycache__":
            tops.add(first)
    return tops


def _wheel_top_levels() -> set[str]:
    tops = set()
    for wheel in WHEELS.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            tops |= {n.split("/")[0].removesuffix(".py") for n in z.namelist()}
    return {t for t in tops if not t.endswith(".dist-info")}


def allowed_top_levels() -> frozenset[str]:
    """Top-level module names importable on the GPU machine (module docstring)."""
    tops: set[str] = set(sys.stdlib_module_names) | _wheel_top_levels()
    for dist in _closure(BASE):
        tops |= _top_levels(dist)
    return frozenset(tops)


class GuardFinder(importlib.abc.MetaPathFinder):
    """Raises on an import the GPU machine lacks when ECHO code asks for it."""

    def __init__(self, allowed: frozenset[str]) -> None:
        self.allowed = allowed
        self.roots = tuple(str(REPO / d) for d in ("packages", "scripts", "tests"))

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        top = fullname.partition(".")[0]
        if top in self.allowed or top.startswith("echo_") or top == "gpu_check":
            return None
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
            frame = frame.f_back
        caller = frame.f_code.co_filename if frame is not None else ""
        if caller.startswith(self.roots):
            raise ImportError(f"{fullname} (imported by {caller}) is not on the GPU machine")
        return None


def install() -> None:
    if not any(isinstance(f, GuardFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, GuardFinder(allowed_top_levels()))


install()  # as a pytest plugin (-p gpu_check.import_guard) or on import in the dry run
