"""SGLang's own Triton kernels, the twins the speculative ops are checked against.

SGLang cannot be installed on CPU machines, so the tests read its pinned 0.5.23 source from the
unpacked wheel that ``scripts/fetch_sglang_source.sh`` leaves in ``.cache/sglang-src/site``
(``ECHO_SGLANG_SRC`` points elsewhere). This file never fetches it: without the source every
twin test skips. ``sglang/__init__`` imports the whole server, so ``sglang`` is mounted as a bare
namespace and only the kernel modules are imported; ``sglang.srt.mem_cache.allocation`` cannot
be imported at all (torchvision, the scheduler), so its one kernel is lifted out of the file's
syntax tree into a temporary module.

The Triton kernels run on the interpreter: ``TRITON_INTERPRET=1`` must be set before triton is
first imported, and the first importer in a pytest process wins, so this file sets it at import
(as echo-kernels' and echo-sglang's conftests do) and fails loudly if it came too late.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

TRITON_IMPORTED_EARLY = "triton" in sys.modules and "TRITON_INTERPRET" not in os.environ
"""Someone imported triton before this file could switch the interpreter on."""

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silences triton 3.9's UserWarning

REPO = Path(__file__).resolve().parents[4]
SITE = REPO / ".cache" / "sglang-src" / "site"
SPEC_OPS = "sglang.kernels.ops.speculative"


@dataclass(frozen=True, slots=True)
class Twins:
    """SGLang 0.5.23's GPU versions of the CPU ops under test (its code, unmodified)."""

    build_tree: Callable[..., Any]  # spec_tree.sgl_build_tree_kernel_triton
    verify_greedy: Callable[..., Any]  # spec_tree.verify_tree_greedy_triton
    reconstruct: Callable[..., Any]  # reconstruct_tree.reconstruct_indices_from_tree_mask_triton
    draft_cache_locs: Callable[..., Any]  # cache_locs.assign_draft_cache_locs_contiguous_func
    extend_cache_locs: Any  # cache_locs.assign_extend_cache_locs, a triton.jit kernel
    req_to_token_pool: Any  # allocation.assign_req_to_token_pool, a triton.jit kernel
    fill_bonus_tokens: Callable[..., Any]  # eagle.fill_bonus_tokens_func
    fill_accept_out_cache_loc: Callable[..., Any]  # eagle.fill_accept_out_cache_loc_func
    rotate_input_ids: Callable[..., Any]  # multi_layer_eagle.rotate_input_ids
    copy_all_layer_kv_cache: Callable[..., Any]  # cache_move.copy_all_layer_kv_cache_func


def _site() -> Path | None:
    override = os.environ.get("ECHO_SGLANG_SRC")
    site = Path(override) if override else SITE
    if not (site / "sglang").is_dir():
        return None
    if not override and not (site / ".complete").exists():
        return None
    return site


def _mount(site: Path) -> None:
    """Make ``import sglang.x.y`` read ``site`` without running ``sglang/__init__``."""
    if str(site) not in sys.path:
        sys.path.append(str(site))  # appended: the venv's packages keep precedence
    if "sglang" not in sys.modules:
        package = types.ModuleType("sglang")
        package.__path__ = [str(site / "sglang")]
        sys.modules["sglang"] = package


def _lift_kernel(source: Path, name: str, workdir: Path) -> Any:
    """The ``@triton.jit`` function ``name`` of ``source``, imported alone from a copy of its
    lines in ``workdir`` (triton.jit reads a kernel's source from its file)."""
    text = source.read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            lines = text.splitlines()[first - 1 : node.end_lineno]
            break
    else:
        raise AssertionError(f"{source} defines no {name}")
    path = workdir / f"lifted_{name}.py"
    header = "import triton\nimport triton.language as tl\n\n\n"
    path.write_text(header + "\n".join(lines) + "\n", encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"lifted_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return getattr(module, name)


@pytest.fixture(scope="session")
def sglang_site() -> Path:
    """The unpacked SGLang source (``site``, holding ``sglang/``); skips the test without it."""
    site = _site()
    if site is None:
        where = os.environ.get("ECHO_SGLANG_SRC") or SITE
        pytest.skip(f"SGLang source absent ({where}); run scripts/fetch_sglang_source.sh")
    return site


@pytest.fixture(scope="session")
def twins(sglang_site: Path, tmp_path_factory: pytest.TempPathFactory) -> Twins:
    """SGLang's Triton kernels, on the interpreter unless CUDA is present (skips without them)."""
    site = sglang_site
    if not torch.cuda.is_available():
        if TRITON_IMPORTED_EARLY:
            pytest.fail(
                "triton was imported before tests/spec/conftest.py could set TRITON_INTERPRET=1: "
                "run these tests alone or export TRITON_INTERPRET=1"
            )
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.fail("TRITON_INTERPRET is off and no GPU is present: see tests/spec/conftest.py")
    _mount(site)
    spec_tree = importlib.import_module(f"{SPEC_OPS}.spec_tree")
    reconstruct = importlib.import_module(f"{SPEC_OPS}.reconstruct_tree")
    cache_locs = importlib.import_module(f"{SPEC_OPS}.cache_locs")
    eagle = importlib.import_module(f"{SPEC_OPS}.eagle")
    multi_layer = importlib.import_module(f"{SPEC_OPS}.multi_layer_eagle")
    cache_move = importlib.import_module("sglang.kernels.ops.kvcache.cache_move")
    allocation = site / "sglang" / "srt" / "mem_cache" / "allocation.py"
    return Twins(
        build_tree=spec_tree.sgl_build_tree_kernel_triton,
        verify_greedy=spec_tree.verify_tree_greedy_triton,
        reconstruct=reconstruct.reconstruct_indices_from_tree_mask_triton,
        draft_cache_locs=cache_locs.assign_draft_cache_locs_contiguous_func,
        extend_cache_locs=cache_locs.assign_extend_cache_locs,
        req_to_token_pool=_lift_kernel(
            allocation, "assign_req_to_token_pool", tmp_path_factory.mktemp("sglang_lifted")
        ),
        fill_bonus_tokens=eagle.fill_bonus_tokens_func,
        fill_accept_out_cache_loc=eagle.fill_accept_out_cache_loc_func,
        rotate_input_ids=multi_layer.rotate_input_ids,
        copy_all_layer_kv_cache=cache_move.copy_all_layer_kv_cache_func,
    )
