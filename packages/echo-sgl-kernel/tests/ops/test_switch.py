"""The ECHO_SGL_KERNEL_FORCE_CPU_BACKEND switch: the parser, the patch, and the .pth line run in
fresh interpreters (it must cost nothing when the variable is unset)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sgl_kernel.switch import ENV_VAR, apply_from_environment, force_cpu_backend, switch_requested

PTH = Path(__file__).resolve().parents[2] / "src" / "echo_sgl_kernel_switch.pth"
SRC = PTH.parent


@pytest.mark.parametrize(
    ("value", "on"),
    [("1", True), ("TRUE", True), (" on ", True), ("0", False), ("", False), ("no", False)],
)
def test_switch_requested_reads_the_variable(value: str, on: bool) -> None:
    assert switch_requested({ENV_VAR: value}) is on
    assert switch_requested({}) is False


def test_force_cpu_backend_makes_torch_report_amx_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    # re-set the current function so the test's patch is undone afterwards
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", torch.cpu._is_amx_tile_supported)
    assert apply_from_environment({ENV_VAR: "0"}) is False
    force_cpu_backend()
    assert torch.cpu._is_amx_tile_supported() is True


def _fresh_python(code: str, switch: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    if switch is not None:
        env[ENV_VAR] = switch
    line = PTH.read_text().strip()
    done = subprocess.run(
        [sys.executable, "-c", f"{line}\n{code}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def test_pth_line_imports_nothing_when_the_switch_is_off() -> None:
    assert PTH.read_text().count("\n") == 1  # one line: site.py runs a .pth line by line
    out = _fresh_python(
        "import sys; print('torch' in sys.modules, 'sgl_kernel' in sys.modules)", None
    )
    assert out == ["False", "False"]


def test_pth_line_patches_torch_before_any_user_import_when_on() -> None:
    code = (
        "import sys; print('torch' in sys.modules); import torch; "
        "print(torch.cpu._is_amx_tile_supported())"
    )
    assert _fresh_python(code, "1") == ["True", "True"]
