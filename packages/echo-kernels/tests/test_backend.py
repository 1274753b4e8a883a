"""Dispatch: which implementation runs, and that the package never needs triton to import."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from echo_kernels.backend import BackendError, use_triton


def test_auto_uses_the_reference_on_cpu() -> None:
    assert not use_triton("auto", torch.device("cpu"))
    assert not use_triton("torch", torch.device("cpu"))


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        use_triton("cuda", torch.device("cpu"))  # type: ignore[arg-type]


def test_forcing_triton_on_cpu_without_the_interpreter_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(BackendError, match="TRITON_INTERPRET=1"):
        use_triton("triton", torch.device("cpu"))


def test_cpu_serving_path_never_imports_triton() -> None:
    # A fresh interpreter: this pytest process may already have imported the kernels.
    script = textwrap.dedent(
        """
        import sys
        import torch
        from echo_core.tree import make_tree
        from echo_kernels import greedy_accept, tree_attention, verify_metadata
        tree = make_tree([[(1, -1, -0.1)]])
        meta = verify_metadata(tree, torch.tensor([2]), torch.tensor([[0, 1, 2, 3]]))
        q = torch.randn(2, 2, 16)
        kv = torch.randn(2, 1, 16)
        pool = torch.randn(4, 1, 16)
        out = tree_attention(q, kv, kv, pool, pool, meta)
        greedy_accept(tree, torch.tensor([1, 2]))
        assert out.shape == q.shape
        assert "triton" not in sys.modules, "triton was imported"
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
