"""The kernels compile for the GPU (sm_90) on this CPU-only machine.

The interpreter is more permissive than Triton's compiler; ``scripts/compile_check.py`` lowers
every kernel through the real pipeline to a cubin (bundled ptxas, no driver needed). It runs in
a subprocess because this process has TRITON_INTERPRET=1, and with a private Triton cache so
the check is hermetic (and honest: nothing is reused from earlier runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from echo_kernels.backend import triton_installed

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compile_check.py"


@pytest.mark.skipif(not triton_installed(), reason="triton is not installed")
def test_every_kernel_compiles_for_sm90(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--arch", "90"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(": ok, ") == 6, proc.stdout
