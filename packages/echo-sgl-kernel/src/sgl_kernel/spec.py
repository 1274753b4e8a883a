"""The speculative-decoding ops of ``sgl_kernel``'s CPU build, as SGLang 0.5.23 imports them.

SGLang's CPU path (``SGLANG_USE_CPU_ENGINE=1``, EAGLE / EAGLE3 / STANDALONE / NGRAM / MTP)
imports these names from ``sgl_kernel`` and calls them as Python functions; this module
re-exports the pure-torch implementations and also registers each as
``torch.ops.sgl_kernel.<name>`` for callers that go through the dispatcher, with a schema that
follows the compiled op's C++ signature (``Tensor(a!)`` marks the tensors an op writes).

Op (SGLang 0.5.23 call site, under ``sglang/``):

- build_tree_kernel_efficient_cpu, verify_tree_greedy_cpu: kernels/ops/speculative/spec_tree.py
- reconstruct_indices_from_tree_mask (NGRAM): kernels/ops/speculative/reconstruct_tree.py, which
  imports it from ``sgl_kernel.speculative``
- assign_draft_cache_locs_contiguous_cpu, assign_extend_cache_locs_cpu:
  kernels/ops/speculative/cache_locs.py
- assign_req_to_token_pool_cpu: srt/mem_cache/allocation.py
- fill_bonus_tokens_cpu, fill_accept_out_cache_loc_cpu: kernels/ops/speculative/eagle.py
- rotate_input_ids_cpu (multi-layer EAGLE / MTP): kernels/ops/speculative/multi_layer_eagle.py
- build_draft_decode_metadata_cpu (multi-step draft decode, topk > 1):
  srt/layers/attention/intel_amx_backend.py
- copy_all_layer_kv_cache_cpu: kernels/ops/kvcache/cache_move.py
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sgl_kernel.library import register
from sgl_kernel.spec_cache import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
)
from sgl_kernel.spec_tokens import fill_bonus_tokens_cpu, rotate_input_ids_cpu
from sgl_kernel.spec_tree import (
    build_tree_kernel_efficient_cpu,
    reconstruct_indices_from_tree_mask,
    verify_tree_greedy_cpu,
)

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]

SCHEMAS: tuple[tuple[str, Callable[..., Any]], ...] = (
    (
        "build_tree_kernel_efficient_cpu(Tensor parent_list, Tensor selected_index, "
        "Tensor verified_seq_len, Tensor(a!) tree_mask, Tensor(b!) positions, "
        "Tensor(c!) retrive_index, Tensor(d!) retrive_next_token, "
        "Tensor(e!) retrive_next_sibling, int topk, int depth, int draft_token_num, "
        "int tree_mask_mode) -> ()",
        build_tree_kernel_efficient_cpu,
    ),
    (
        "verify_tree_greedy_cpu(Tensor(a!) predicts, Tensor(b!) accept_index, "
        "Tensor(c!) accept_token_num, Tensor candidates, Tensor retrive_index, "
        "Tensor retrive_next_token, Tensor retrive_next_sibling, Tensor target_predict) -> ()",
        verify_tree_greedy_cpu,
    ),
    (
        "reconstruct_indices_from_tree_mask(Tensor tree_mask, Tensor verified_seq_len, "
        "Tensor(a!) positions, Tensor(b!) retrive_index, Tensor(c!) retrive_next_token, "
        "Tensor(d!) retrive_next_sibling, int batch_size, int draft_token_num) -> ()",
        reconstruct_indices_from_tree_mask,
    ),
    (
        "assign_draft_cache_locs_contiguous_cpu(Tensor req_pool_indices, Tensor req_to_token, "
        "Tensor seq_lens, Tensor(a!) out_cache_loc, int pool_len, int topk, int num_steps) -> ()",
        assign_draft_cache_locs_contiguous_cpu,
    ),
    (
        "assign_extend_cache_locs_cpu(Tensor req_pool_indices, Tensor req_to_token, "
        "Tensor start_offset, Tensor end_offset, Tensor(a!) out_cache_loc, int pool_len) -> ()",
        assign_extend_cache_locs_cpu,
    ),
    (
        "assign_req_to_token_pool_cpu(Tensor req_pool_indices, Tensor(a!) req_to_token, "
        "Tensor start_offset, Tensor end_offset, Tensor out_cache_loc, int pool_len) -> ()",
        assign_req_to_token_pool_cpu,
    ),
    (
        "fill_bonus_tokens_cpu(Tensor accept_tokens, Tensor accept_lens, "
        "Tensor(a!) bonus_tokens, int accept_stride) -> ()",
        fill_bonus_tokens_cpu,
    ),
    (
        "fill_accept_out_cache_loc_cpu(Tensor accept_index, Tensor out_cache_loc, "
        "Tensor(a!) accept_out_cache_loc, int? size=None) -> ()",
        fill_accept_out_cache_loc_cpu,
    ),
    (
        "rotate_input_ids_cpu(Tensor(a!) input_ids, Tensor extend_start_loc, "
        "Tensor extend_seq_lens, Tensor topk_index, Tensor? select_index=None) -> ()",
        rotate_input_ids_cpu,
    ),
    (
        "build_draft_decode_metadata_cpu(Tensor req_to_token, Tensor req_pool_indices, "
        "Tensor seq_lens, int topk, int num_steps, int pool_len) -> Tensor",
        build_draft_decode_metadata_cpu,
    ),
    (
        # The buffers move through the raw addresses in data_ptrs: no tensor argument is written.
        "copy_all_layer_kv_cache_cpu(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, "
        "Tensor src_loc) -> ()",
        copy_all_layer_kv_cache_cpu,
    ),
)
"""Schema and implementation of every op registered under torch.ops.sgl_kernel."""

for _schema, _impl in SCHEMAS:
    register(_schema, _impl)
