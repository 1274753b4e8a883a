"""SGLang 0.5.23's own CPU call sites of the speculative ops, run against this package.

Run as ``python cpu_call_sites.py SITE`` with ``SGLANG_USE_CPU_ENGINE=1`` (test_spec_call_sites
does): SGLang's kernel modules then take their CPU branches at import, ``from sgl_kernel import
...`` resolves to this package, and SGLang's wrappers call the ops with their own argument
order, keywords and dtypes. Each result is checked against a direct call of the op on fresh
buffers; the script prints "ok" last. A process of its own because SGLang fixes the platform at
import, while the other tests import the same modules with the GPU branches.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import sgl_kernel

SPEC_OPS = "sglang.kernels.ops.speculative"


def _module(name: str) -> Any:
    module = importlib.import_module(name)
    if getattr(module, "_is_cpu", True) is not True:
        raise AssertionError(f"{name} did not take its CPU branch: is SGLANG_USE_CPU_ENGINE=1?")
    return module


def _same(got: Tensor, want: Tensor, what: str) -> None:
    if got.tolist() != want.tolist():
        raise AssertionError(
            f"{what}: SGLang's call site gave {got.tolist()}, want {want.tolist()}"
        )


def _trees() -> None:
    """EAGLE build + greedy verify (spec_tree.py) and the NGRAM rebuild (reconstruct_tree.py)."""
    spec_tree = _module(f"{SPEC_OPS}.spec_tree")
    # topk 2, 3 steps, T 6: beams (-1, 0, 1, 2, 4); request 1 selects entries 0 1 2 4 6 (nodes
    # 1, 2 under the root, 3 under 1, 4 under 2, 5 under 3), request 2 selects 0 1 2 3 6.
    parent_list = torch.tensor([[-1, 0, 1, 2, 4], [-1, 0, 1, 2, 4]])
    selected = torch.tensor([[0, 1, 2, 4, 6], [0, 1, 2, 3, 6]])
    seq_lens = torch.tensor([4, 7])
    bufs = []
    for build in (
        spec_tree.build_tree_kernel_efficient_func,
        sgl_kernel.build_tree_kernel_efficient_cpu,
    ):
        mask = torch.ones((2 * 6 * 6,), dtype=torch.bool)
        positions = torch.empty((12,), dtype=torch.int64)
        links = torch.full((3, 2, 6), -1, dtype=torch.int64)
        mode = spec_tree.TreeMaskMode.QLEN_ONLY
        index, first, sibling = links
        build(
            parent_list, selected, seq_lens, mask, positions, index, first, sibling, 2, 3, 6, mode
        )
        bufs.append((mask, positions, links))
    for got, want, what in zip(bufs[0], bufs[1], ("tree_mask", "positions", "links"), strict=True):
        _same(got, want, f"build_tree_kernel_efficient_func {what}")
    mask, positions, links = bufs[1]

    candidates = torch.tensor([[9, 5, 6, 7, 8, 1], [9, 5, 6, 6, 8, 3]])
    target = torch.tensor([[5, 7, 1, 2, 2, 2], [6, 2, 8, 4, 4, 4]])
    outs = []
    for call_site in (True, False):
        predicts = torch.zeros((12,), dtype=torch.int32)
        accept_index = torch.full((2, 4), -1, dtype=torch.int32)
        accepted = torch.empty((2,), dtype=torch.int32)
        if call_site:
            spec_tree.verify_tree_greedy_func(
                predicts=predicts,
                accept_index=accept_index,
                accept_token_num=accepted,
                candidates=candidates,
                retrieve_index=links[0],
                retrieve_next_token=links[1],
                retrieve_next_sibling=links[2],
                target_predict=target,
                topk=2,
            )
        else:
            sgl_kernel.verify_tree_greedy_cpu(
                predicts, accept_index, accepted, candidates, links[0], links[1], links[2], target
            )
        outs.append((predicts, accept_index, accepted))
    for got, want in zip(outs[0], outs[1], strict=True):
        _same(got, want, "verify_tree_greedy_func")
    _same(outs[1][1], torch.tensor([[0, 1, 3, -1], [6, 8, -1, -1]]), "accepted path")

    rebuild = _module(f"{SPEC_OPS}.reconstruct_tree").reconstruct_indices_from_tree_mask_func
    rebuilt = torch.full((4, 12), -1, dtype=torch.int64)
    rebuild(mask, seq_lens, rebuilt[0], rebuilt[1], rebuilt[2], rebuilt[3], 2, 6)
    _same(rebuilt[0], positions, "reconstruct positions")
    _same(rebuilt[1:], links.view(3, -1), "reconstruct links")


def _cache_locs() -> None:
    """cache_locs.py, eagle.py and cache_move.py wrappers."""
    cache_locs = _module(f"{SPEC_OPS}.cache_locs")
    eagle = _module(f"{SPEC_OPS}.eagle")
    table = torch.arange(3 * 30, dtype=torch.int32).view(3, 30) + 1000
    rows, seq_lens = torch.tensor([2, 0]), torch.tensor([5, 11])

    out, want = torch.empty((2, 12), dtype=torch.int64)
    cache_locs.assign_draft_cache_locs_contiguous_func(rows, table, seq_lens, out, 2, 3)
    sgl_kernel.assign_draft_cache_locs_contiguous_cpu(rows, table, seq_lens, want, 30, 2, 3)
    _same(out, want, "assign_draft_cache_locs_contiguous_func")

    start, end = torch.tensor([3, 9]), torch.tensor([7, 13])
    got = cache_locs.assign_extend_cache_locs_func(
        req_pool_indices=rows,
        req_to_token=table,
        start_offset=start,
        end_offset=end,
        batch_size=2,
        draft_token_num=4,
        device="cpu",
    )
    want = torch.empty((8,), dtype=torch.int64)
    sgl_kernel.assign_extend_cache_locs_cpu(rows, table, start, end, want, 30)
    _same(got, want, "assign_extend_cache_locs_func")

    window = torch.arange(100, 112)  # 2 requests x 6 verify slots
    front = torch.zeros((12,), dtype=torch.int64)
    cache_locs.fill_front_out_cache_loc_func(torch.tensor([2, 3], dtype=torch.int32), window, front)
    _same(front[:5], torch.tensor([100, 101, 106, 107, 108]), "fill_front_out_cache_loc_func")

    accept_index = torch.tensor([[0, 2, -1], [6, -1, -1]], dtype=torch.int32)
    accepted = torch.zeros((6,), dtype=torch.int64)
    eagle.fill_accept_out_cache_loc_func(accept_index, window, accepted, 6)
    _same(accepted[:3], torch.tensor([100, 102, 106]), "fill_accept_out_cache_loc_func")

    tokens = torch.tensor([[4, 5, 6], [7, 8, 9]], dtype=torch.int32)
    bonus = torch.empty((2,), dtype=torch.int32)
    eagle.fill_bonus_tokens_func(tokens, torch.tensor([2, 3], dtype=torch.int32), bonus, 3, 2)
    _same(bonus, torch.tensor([5, 9]), "fill_bonus_tokens_func")

    cache_move = _module("sglang.kernels.ops.kvcache.cache_move")
    k, v = torch.arange(24.0).view(6, 4), torch.arange(24.0).view(6, 4) + 100
    ptrs = torch.tensor([k.data_ptr(), v.data_ptr()], dtype=torch.uint64)
    strides = torch.tensor([16, 16])
    tgt, src = torch.tensor([0, 5, 9]), torch.tensor([5, 0, 9])  # only the first 2 are live
    config = {"bytes_per_tile": 128, "byte_tiles": 1, "num_warps": 4}
    cache_move.copy_all_layer_kv_cache_func(ptrs, strides, tgt, src, 2, 2, config)
    _same(k[[0, 5]], torch.arange(24.0).view(6, 4)[[5, 0]], "copy_all_layer_kv_cache_func k")
    _same(v[[0, 5]], torch.arange(24.0).view(6, 4)[[5, 0]] + 100, "copy_all_layer_kv_cache_func v")


def _rotation() -> None:
    """multi_layer_eagle.rotate_input_ids, with and without select_index."""
    rotate = _module(f"{SPEC_OPS}.multi_layer_eagle").rotate_input_ids
    starts, lens = torch.tensor([0, 3]), torch.tensor([3, 2])
    ids = rotate(torch.tensor([1, 2, 3, 4, 5]), starts, lens, torch.tensor([[8], [9]]))
    _same(ids, torch.tensor([2, 3, 8, 5, 9]), "rotate_input_ids")
    ids = rotate(
        torch.tensor([1, 2, 3, 4, 5]), starts, lens, torch.tensor([8, 9]), torch.tensor([1, 3])
    )
    _same(ids, torch.tensor([2, 8, 3, 9, 5]), "rotate_input_ids with select_index")


def main(site: Path) -> None:
    """Mount SGLang's source at ``site`` and run every call site."""
    sys.path.append(str(site))
    package = types.ModuleType("sglang")
    package.__path__ = [str(site / "sglang")]
    sys.modules["sglang"] = package
    _trees()
    _cache_locs()
    _rotation()
    print("ok")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
