"""The ops exist under the names SGLang 0.5.23's CPU path calls, with its argument lists.

Each row: op, the argument count of SGLang's call (positional calls) or the keyword names it
passes, and the tensors the op writes (``Tensor(a!)`` in the schema). The call sites:

- layers/layernorm.py: rmsnorm_cpu, fused_add_rmsnorm_cpu, gemma_*, gemma3/4_rmsnorm_cpu,
  layernorm_cpu; layers/rotary_embedding/base.py, rope_variant.py: rotary_embedding_cpu;
  layers/rotary_embedding/utils.py: apply_rotary_pos_emb_cpu; layers/activation.py: *_and_mul_cpu
- utils/common.py, layers/amx_utils.py: convert_weight_packed, conv3d_embed_weight_pack;
  layers/quantization/unquant.py, logits_processor.py: weight_packed_linear
- layers/attention/intel_amx_backend.py: decode_attention_cpu, extend_attention_cpu;
  layers/attention/vision.py: flash_attn_varlen_func; layers/conv.py: conv3d_embed_cpu
- mem_cache/memory_pool.py: store_cache_cpu; distributed/bootstrap.py: init_cpu_threads_env,
  initialize; distributed/parallel_state.py: shm_allreduce, shm_allgather
"""

from __future__ import annotations

import pytest
import torch

import sgl_kernel

OPS = torch.ops.sgl_kernel

# op -> (argument count, keywords SGLang passes by name, arguments the op writes)
CALLS: dict[str, tuple[int, tuple[str, ...], frozenset[str]]] = {
    "rmsnorm_cpu": (3, (), frozenset()),
    "fused_add_rmsnorm_cpu": (4, (), frozenset({"input", "residual"})),
    "gemma_rmsnorm_cpu": (3, (), frozenset()),
    "gemma_fused_add_rmsnorm_cpu": (4, (), frozenset({"input", "residual"})),
    "gemma3_rmsnorm_cpu": (3, (), frozenset()),
    "gemma4_rmsnorm_cpu": (5, (), frozenset()),
    "layernorm_cpu": (4, (), frozenset()),
    "rotary_embedding_cpu": (6, (), frozenset()),
    "apply_rotary_pos_emb_cpu": (4, (), frozenset()),
    "silu_and_mul_cpu": (1, (), frozenset()),
    "gelu_and_mul_cpu": (1, (), frozenset()),
    "gelu_tanh_and_mul_cpu": (1, (), frozenset()),
    "convert_weight_packed": (1, (), frozenset()),
    "weight_packed_linear": (4, (), frozenset()),
    "decode_attention_cpu": (19, (), frozenset({"k_cache", "v_cache", "output"})),
    "extend_attention_cpu": (22, (), frozenset({"o_extend"})),
    "flash_attn_varlen_func": (
        9,
        ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "causal"),
        frozenset(),
    ),
    "conv3d_embed_weight_pack": (1, (), frozenset()),
    "conv3d_embed_cpu": (4, ("is_vnni",), frozenset()),
    "store_cache_cpu": (6, (), frozenset({"k_cache", "v_cache"})),
    "init_cpu_threads_env": (1, (), frozenset()),
    "initialize": (2, (), frozenset()),
    "shm_allreduce": (2, (), frozenset({"data"})),
    "shm_allgather": (2, (), frozenset()),
}

# ``from sgl_kernel import <name>`` on SGLang's CPU path (intel_amx_backend.py, allocation.py,
# kernels/ops/kvcache/cache_move.py, kernels/ops/speculative/*.py)
PYTHON_IMPORTS = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_op_schema_fits_the_sglang_call(name: str) -> None:
    count, keywords, written = CALLS[name]
    schema = getattr(OPS, name).default._schema
    names = [arg.name for arg in schema.arguments]
    assert len(names) == count, names
    assert set(keywords) <= set(names)
    writes = {arg.name for arg in schema.arguments if arg.alias_info and arg.alias_info.is_write}
    assert writes == written


@pytest.mark.parametrize("name", sorted(CALLS))
def test_op_is_exported_as_a_python_function(name: str) -> None:
    assert callable(getattr(sgl_kernel, name))
    assert name in sgl_kernel.__all__


@pytest.mark.parametrize("name", PYTHON_IMPORTS)
def test_cpu_path_python_imports_resolve(name: str) -> None:
    assert callable(getattr(sgl_kernel, name))


def test_convert_weight_packed_is_what_sglang_probes_for() -> None:
    # sglang.srt.utils.common._is_intel_amx_backend_available
    assert hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
