"""Device dispatch: which implementation of a kernel runs for a given call.

Every public function takes ``backend``:

- ``"auto"`` (default): the Triton kernel for CUDA tensors when triton is installed, the torch
  reference otherwise (CPU serving, or a CUDA machine without triton);
- ``"torch"``: always the torch reference;
- ``"triton"``: always the Triton kernel. On CPU tensors this needs the Triton interpreter,
  i.e. ``TRITON_INTERPRET=1`` in the environment before ``triton`` is first imported (the tests
  do this in ``tests/conftest.py``); otherwise it raises instead of failing inside triton with
  "0 active drivers".

Nothing here imports triton: the package imports and serves on machines without it.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Literal

import torch

Backend = Literal["auto", "torch", "triton"]
"""Implementation selector accepted by every public kernel function."""

BACKENDS: tuple[Backend, ...] = ("auto", "torch", "triton")


class BackendError(RuntimeError):
    """The requested backend cannot run on this machine or for these tensors."""


def triton_installed() -> bool:
    """Whether ``import triton`` would succeed (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether the Triton interpreter is requested (``TRITON_INTERPRET`` set to a true value)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def use_triton(backend: Backend, device: torch.device) -> bool:
    """Resolve ``backend`` for tensors on ``device``: True = Triton kernel, False = reference."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    if backend == "auto":
        return device.type == "cuda" and triton_installed()
    if not triton_installed():
        raise BackendError("backend='triton' but triton is not installed (pip install triton)")
    if device.type != "cuda" and not interpreting():
        raise BackendError(
            f"backend='triton' on {device} tensors needs TRITON_INTERPRET=1 set before triton "
            "is imported (the interpreter runs kernels on the CPU, for tests only)"
        )
    return True
