"""Test set-up of echo-kernels: the Triton interpreter on machines without a GPU.

``TRITON_INTERPRET=1`` only takes effect if it is set before ``triton`` is first imported, and
pytest runs every package's tests in one process. This file is imported when pytest starts
collecting ``packages/echo-kernels``; echo-kernels itself imports triton lazily (from
``echo_kernels.triton_kernels`` only), and no other ECHO package imports it directly. But
``transformers`` does (its Llama modelling module imports triton when installed), so test
modules collected *before* this directory that import transformers would defeat it. The
default order (``testpaths``, packages alphabetically: echo-kernels before echo-server) is
safe; :func:`kernel_device` fails loudly when the order was not.

On a CUDA machine the variable is left alone, so the same "Triton vs reference" tests run the
compiled kernels on the GPU instead of the interpreter.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

TRITON_IMPORTED_EARLY = "triton" in sys.modules and "TRITON_INTERPRET" not in os.environ
"""Someone imported triton before this file could switch the interpreter on."""

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silences triton 3.9's UserWarning

from echo_kernels.backend import interpreting, triton_installed  # noqa: E402


@pytest.fixture
def kernel_device() -> torch.device:
    """Device of the "Triton vs reference" tier: CUDA when present, else the interpreter's CPU."""
    if not triton_installed():
        pytest.skip("triton is not installed")
    if torch.cuda.is_available() and not interpreting():
        return torch.device("cuda")
    if TRITON_IMPORTED_EARLY:
        pytest.fail(
            "triton was imported (e.g. by transformers) before packages/echo-kernels/tests/"
            "conftest.py could set TRITON_INTERPRET=1: collect echo-kernels first, run it "
            "alone, or export TRITON_INTERPRET=1"
        )
    if not interpreting():
        pytest.fail("TRITON_INTERPRET is off and no GPU is present: see tests/conftest.py")
    return torch.device("cpu")
