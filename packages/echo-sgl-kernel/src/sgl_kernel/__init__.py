"""Pure-torch ``sgl_kernel``: the CPU ops SGLang's CPU serving and speculative path call.

Importing the package registers every op as ``torch.ops.sgl_kernel.<name>`` (through
:mod:`sgl_kernel.library`) and re-exports the Python functions SGLang imports with
``from sgl_kernel import <name>``. See README.md for the op list and the
ECHO_SGL_KERNEL_FORCE_CPU_BACKEND switch (:mod:`sgl_kernel.switch`).
"""

from __future__ import annotations

from sgl_kernel.activation import gelu_and_mul_cpu, gelu_tanh_and_mul_cpu, silu_and_mul_cpu
from sgl_kernel.collectives import initialize, shm_allgather, shm_allreduce
from sgl_kernel.conv import conv3d_embed_cpu, conv3d_embed_weight_pack
from sgl_kernel.decode_attention import decode_attention_cpu
from sgl_kernel.extend_attention import extend_attention_cpu
from sgl_kernel.kv_store import store_cache_cpu
from sgl_kernel.linear import convert_weight_packed, weight_packed_linear
from sgl_kernel.norm import (
    fused_add_rmsnorm_cpu,
    gemma3_rmsnorm_cpu,
    gemma4_rmsnorm_cpu,
    gemma_fused_add_rmsnorm_cpu,
    gemma_rmsnorm_cpu,
    layernorm_cpu,
    rmsnorm_cpu,
)
from sgl_kernel.rope import apply_rotary_pos_emb_cpu, rotary_embedding_cpu
from sgl_kernel.threads import init_cpu_threads_env
from sgl_kernel.varlen_attention import flash_attn_varlen_func

try:
    from sgl_kernel import spec
    from sgl_kernel.spec import *  # noqa: F403  (speculative helpers, spec.py)
except ModuleNotFoundError as error:  # only while spec.py is being written
    if error.name != "sgl_kernel.spec":
        raise
    _spec_names: list[str] = []
else:
    _spec_names = list(spec.__all__)

__version__ = "0.1.0"

__all__ = [
    "apply_rotary_pos_emb_cpu",
    "conv3d_embed_cpu",
    "conv3d_embed_weight_pack",
    "convert_weight_packed",
    "decode_attention_cpu",
    "extend_attention_cpu",
    "flash_attn_varlen_func",
    "fused_add_rmsnorm_cpu",
    "gelu_and_mul_cpu",
    "gelu_tanh_and_mul_cpu",
    "gemma3_rmsnorm_cpu",
    "gemma4_rmsnorm_cpu",
    "gemma_fused_add_rmsnorm_cpu",
    "gemma_rmsnorm_cpu",
    "init_cpu_threads_env",
    "initialize",
    "layernorm_cpu",
    "rmsnorm_cpu",
    "rotary_embedding_cpu",
    "shm_allgather",
    "shm_allreduce",
    "silu_and_mul_cpu",
    "store_cache_cpu",
    "weight_packed_linear",
]
__all__ += _spec_names
