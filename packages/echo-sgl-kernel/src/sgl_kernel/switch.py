"""The switch that makes SGLang take its CPU-kernel ("intel_amx") path on any x86/arm CPU.

SGLang picks that path when ``cpu_has_amx_support()`` holds: ``torch.cpu._is_amx_tile_supported()``
(evaluated once, when ``sglang.srt.utils.common`` is imported) and ``sgl_kernel`` exposing
``convert_weight_packed``. These pure-torch ops need no AMX, so on a CPU without it the first
test is the only thing in the way. With ``ECHO_SGL_KERNEL_FORCE_CPU_BACKEND=1`` in the
environment, the ``echo_sgl_kernel_switch.pth`` file this package installs calls
:func:`apply_from_environment` at interpreter start, before any SGLang module runs, in every
process (SGLang's spawned scheduler and detokenizer inherit the variable). Unset, the .pth line
reads one environment variable and imports nothing.

The patch replaces only the Python attribute ``torch.cpu._is_amx_tile_supported``; the C++
function behind it, and so oneDNN's and inductor's own choices, are unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["ENV_VAR", "apply_from_environment", "force_cpu_backend", "switch_requested"]

ENV_VAR = "ECHO_SGL_KERNEL_FORCE_CPU_BACKEND"
_ON = ("1", "true", "yes", "on")


def switch_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ENV_VAR is set to 1, true, yes or on (any case)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_VAR, "").strip().lower() in _ON


def _report_amx_tiles() -> bool:
    """Stand-in for torch.cpu._is_amx_tile_supported while the switch is on."""
    return True


def force_cpu_backend() -> None:
    """Make ``torch.cpu._is_amx_tile_supported()`` return True in this process."""
    import torch.cpu

    torch.cpu._is_amx_tile_supported = _report_amx_tiles


def apply_from_environment(environ: Mapping[str, str] | None = None) -> bool:
    """Apply :func:`force_cpu_backend` when the switch is requested; returns whether it was."""
    if not switch_requested(environ):
        return False
    force_cpu_backend()
    return True
