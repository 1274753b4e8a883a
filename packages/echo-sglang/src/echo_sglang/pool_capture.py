"""Capturing the score pool that SGLang's EAGLE draft hands to ``organize_draft_results``.

EAGLE's draft loop keeps the per-step score, token and parent lists only long enough to pick its
own top-(N - 1) tree. ECHO needs them, so the plugin wraps that function with an AROUND hook
(SGLang's ``HookRegistry``, installed once per worker process by :func:`install_pool_capture`).
The hook passes every call through unchanged and, only inside :func:`capture_draft_pool`,
records the three lists. Outside such a block (plain EAGLE in the same process) it does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

ORGANIZE_TARGET = "sglang.srt.speculative.eagle_utils.organize_draft_results"
"""Dotted path of the function whose inputs are the pool."""


@dataclass(slots=True)
class CapturedPool:
    """What one draft step recorded; ``lists`` stays None if organize never ran."""

    lists: tuple[list[Tensor], list[Tensor], list[Tensor]] | None = field(default=None)


_ACTIVE: ContextVar[CapturedPool | None] = ContextVar("echo_sglang_pool_capture", default=None)


@contextmanager
def capture_draft_pool() -> Iterator[CapturedPool]:
    """Record the pool of the EAGLE draft run inside this block."""
    captured = CapturedPool()
    token = _ACTIVE.set(captured)
    try:
        yield captured
    finally:
        _ACTIVE.reset(token)


def organize_hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook: record ``(score_list, token_list, parents_list)``, then call through."""
    captured = _ACTIVE.get()
    if captured is not None:
        lists = _pool_args(args, kwargs)
        captured.lists = (list(lists[0]), list(lists[1]), list(lists[2]))
    return original(*args, **kwargs)


def _pool_args(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    names = ("score_list", "token_list", "parents_list")
    values = list(args[:3]) + [kwargs[n] for n in names[len(args[:3]) :]]
    return values[0], values[1], values[2]


def install_pool_capture() -> None:
    """Register and apply the hook, once per process (SGLang's registry keeps duplicates)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if not _installed:
        HookRegistry.register(ORGANIZE_TARGET, organize_hook, HookType.AROUND)
        _installed.append(ORGANIZE_TARGET)
    HookRegistry.apply_hooks()  # idempotent: already patched targets are skipped


_installed: list[str] = []
"""Targets this process registered (SGLang's registry is process-global too)."""
