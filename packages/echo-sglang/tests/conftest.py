"""Test set-up of the SGLang plugin: SGLang's own source, its Triton kernels on CPU, EAGLE drafts.

SGLang cannot be installed on CPU machines (it pins CUDA torch), so the tests read its pinned
source from an unpacked wheel (``scripts/fetch_sglang_source.sh``, default
``.cache/sglang-src/site``; ``ECHO_SGLANG_SRC`` points elsewhere). When it is missing the fixture
runs the fetch script once (about 47 MB from PyPI; ``ECHO_SGLANG_FETCH=0`` turns that off, and a
failed fetch is not retried for a day); without the source every test that needs SGLang skips.

``sglang/__init__`` imports the whole server (IPython, torchvision, ...), so the fixture mounts
``sglang`` as a bare namespace and imports only the modules under test: the tree kernels of
``sglang.kernels.ops.speculative.spec_tree`` (their Triton versions, SGLang's XPU path), the
Triton ``extend_attention_fwd`` and the plugin registry.

``TRITON_INTERPRET=1`` must be set before triton is first imported; pytest runs every package in
one process and the first importer wins, so this file sets it too (echo-kernels' conftest does
the same). On a CUDA machine it is left alone.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from echo_core.acceptance import PAD_NODE, AcceptResult
from echo_sglang.padded import PaddedVerifyInput

TRITON_IMPORTED_EARLY = "triton" in sys.modules and "TRITON_INTERPRET" not in os.environ
"""Someone imported triton before this file could switch the interpreter on."""

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silences triton 3.9's UserWarning

REPO = Path(__file__).resolve().parents[3]
CACHE = REPO / ".cache" / "sglang-src"
FETCH_SCRIPT = REPO / "scripts" / "fetch_sglang_source.sh"
FAILED_MARKER = CACHE / "fetch-failed"
RETRY_AFTER_S = 24 * 3600
FETCH_TIMEOUT_S = 300


@dataclass(frozen=True, slots=True)
class SGLang:
    """The pieces of SGLang 0.5.23 the tests call (its own code, unmodified)."""

    site: Path
    verify_tree_greedy: Callable[..., Any]  # spec_tree.verify_tree_greedy_triton
    build_tree: Callable[..., Any]  # spec_tree.sgl_build_tree_kernel_triton
    extend_attention: Callable[..., Any]  # extend_attention.extend_attention_fwd
    tree_mask_mode: Any  # spec_tree.TreeMaskMode

    def greedy(self, layout: PaddedVerifyInput, target_predict: Tensor) -> AcceptResult:
        """SGLang's greedy tree verify over ``layout``; target_predict: [B * T] int64."""
        b, t = layout.batch_size, layout.num_draft_tokens
        predicts = torch.zeros(b * t, dtype=torch.int32)
        accept_index = torch.full((b, layout.max_tree_depth), -1, dtype=torch.int32)
        accepted = torch.zeros(b, dtype=torch.int32)
        self.verify_tree_greedy(
            predicts,
            accept_index,
            accepted,
            layout.draft_token.view(b, t),
            layout.retrive_index,
            layout.retrive_next_token,
            layout.retrive_next_sibling,
            target_predict.view(b, t),
        )
        return accept_result(accept_index, accepted, predicts, t)


def accept_result(
    accept_index: Tensor,  # [B, L] int32/int64, flat padded slots, -1 after the accepted path
    accept_token_num: Tensor,  # [B] int, accepted draft nodes per request
    predicts: Tensor,  # [B * T] int, target token at the accepted slots
    num_draft_tokens: int,  # T
) -> AcceptResult:
    """SGLang's verify outputs read back as echo-core's AcceptResult (test-side only).

    ``accept_index[b, 0]`` is the root's flat slot ``b T``, then the flat slots ``b T + 1 + i``
    of the accepted nodes in depth order, -1 after; ``accept_token_num`` counts accepted draft
    nodes (the bonus not counted); the bonus token of request b is
    ``predicts[accept_index[b, accept_token_num[b]]]``. (echo_sglang.accept until 2026-12-05.)
    """
    b, width = accept_index.shape
    t = num_draft_tokens
    if accept_token_num.shape != (b,) or predicts.shape != (b * t,):
        raise ValueError(
            f"accept_token_num must be [B={b}] and predicts [B*T={b * t}], got "
            f"{tuple(accept_token_num.shape)} and {tuple(predicts.shape)}"
        )
    count = accept_token_num.to(torch.int64)
    if b and bool(((count < 0) | (count >= width)).any()):
        raise ValueError(f"accept_token_num must lie in [0, {width - 1}], got {count.tolist()}")
    index = accept_index.to(torch.int64)
    level = torch.arange(1, width, device=index.device)  # [L - 1]
    valid = level.unsqueeze(0) <= count.unsqueeze(1)  # [B, L - 1]
    base = torch.arange(b, device=index.device).unsqueeze(1) * t
    nodes = torch.where(valid, index[:, 1:] - base - 1, PAD_NODE)
    keep = int(count.max()) if b else 0
    last = index.gather(1, count.unsqueeze(1)).squeeze(1)  # [B] flat slot of the last accepted
    return AcceptResult(
        accepted_nodes=nodes[:, :keep].contiguous(),
        num_accepted=count,
        bonus_token=predicts.to(torch.int64)[last],
    )


def _fetch() -> str | None:
    """Run the fetch script into CACHE; the reason it failed, or None."""
    if os.environ.get("ECHO_SGLANG_FETCH", "1") == "0":
        return "ECHO_SGLANG_FETCH=0"
    if FAILED_MARKER.exists() and time.time() - FAILED_MARKER.stat().st_mtime < RETRY_AFTER_S:
        return f"an earlier fetch failed (delete {FAILED_MARKER} to retry)"
    try:
        done = subprocess.run(
            ["bash", str(FETCH_SCRIPT), str(CACHE)],
            capture_output=True,
            text=True,
            timeout=FETCH_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        reason = f"fetch did not finish: {exc}"
    else:
        if done.returncode == 0:
            return None
        reason = f"fetch failed: {done.stderr.strip().splitlines()[-1:]}"
    CACHE.mkdir(parents=True, exist_ok=True)
    FAILED_MARKER.write_text(reason + "\n", encoding="utf-8")
    return reason


def _locate() -> tuple[Path | None, str]:
    override = os.environ.get("ECHO_SGLANG_SRC")
    if override:
        site = Path(override)
        return (site, "") if (site / "sglang").is_dir() else (None, f"no sglang/ in {site}")
    site = CACHE / "site"
    if not (site / ".complete").exists():
        reason = _fetch()
        if reason is not None:
            return None, f"SGLang source unavailable ({reason}); run {FETCH_SCRIPT.name}"
    return site, ""


def _mount(site: Path) -> None:
    """Make ``import sglang.x.y`` read ``site`` without running ``sglang/__init__``."""
    if str(site) not in sys.path:
        sys.path.append(str(site))  # appended: the venv's packages keep precedence
    if "sglang" not in sys.modules:
        package = types.ModuleType("sglang")
        package.__path__ = [str(site / "sglang")]
        sys.modules["sglang"] = package


@pytest.fixture(scope="session")
def sglang_site() -> Path:
    """SGLang's source mounted for import (skips the test when it cannot be had)."""
    site, reason = _locate()
    if site is None:
        pytest.skip(reason)
    _mount(site)
    return site


@pytest.fixture(scope="session")
def sgl(sglang_site: Path) -> SGLang:
    """SGLang's tree and attention kernels, on the Triton interpreter unless CUDA is present."""
    if not torch.cuda.is_available():
        if TRITON_IMPORTED_EARLY:
            pytest.fail(
                "triton was imported before echo-sglang's tests/conftest.py could set "
                "TRITON_INTERPRET=1: run these tests alone or export TRITON_INTERPRET=1"
            )
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.fail("TRITON_INTERPRET is off and no GPU is present: see tests/conftest.py")
    spec_tree = importlib.import_module("sglang.kernels.ops.speculative.spec_tree")
    attention = importlib.import_module("sglang.kernels.ops.attention.extend_attention")
    return SGLang(
        site=sglang_site,
        verify_tree_greedy=spec_tree.verify_tree_greedy_triton,
        build_tree=spec_tree.sgl_build_tree_kernel_triton,
        extend_attention=attention.extend_attention_fwd,
        tree_mask_mode=spec_tree.TreeMaskMode,
    )
