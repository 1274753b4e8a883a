"""SGLang's CPU call sites run this package's speculative ops (see cpu_call_sites.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import sgl_kernel

SCRIPT = Path(__file__).with_name("cpu_call_sites.py")
TIMEOUT_S = 300


def test_sglang_cpu_call_sites_run_on_this_package(sglang_site: Path) -> None:
    package_root = Path(sgl_kernel.__file__).resolve().parents[1]
    path = os.pathsep.join(p for p in (str(package_root), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", PYTHONPATH=path)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(sglang_site)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().splitlines()[-1:] == ["ok"], done.stdout[-2000:]
