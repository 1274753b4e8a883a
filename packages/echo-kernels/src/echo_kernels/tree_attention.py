"""Ragged tree attention over a KV pool: the verify pass (and prefill) of every layer.

Query rows of all requests are packed (``[R, Hq, D]``, ragged by ``meta.cu_rows``); each row
attends to its request's cached prefix, read from the pool through ``meta.req_to_slot``, and to
the new rows its mask allows (:mod:`echo_kernels.attention_metadata`). No request is padded to
the largest one: a zero-node request costs one query row.

K/V of the new rows are passed separately (``k_new``/``v_new``, the layer's fresh projections):
the kernel never reads back slots written in the same step, and the caller may store them into
their pool slots before or after the call (``k_pool[row_slots] = k_new``); :mod:`echo_kernels.
kv_commit` then keeps the accepted rows' slots without copying KV. Token-granular slots (page
size 1) keep that commit copy-free; paged pools are not supported.

The Triton kernel (CUDA) and the torch reference (CPU) compute the same function; see
:data:`echo_kernels.tolerances.ATTENTION_TOLERANCES` for how closely they agree per dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from echo_kernels.attention_metadata import TreeAttentionMetadata
from echo_kernels.backend import Backend, interpreting, use_triton
from echo_kernels.tree_attention_reference import tree_attention_reference

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
LOG2_E = 1.4426950408889634


@dataclass(frozen=True, slots=True)
class AttentionConfig:
    """Compile-time tile sizes of one kernel launch (scripts/compile_check.py compiles these)."""

    block_m: int  # (row, query head) pairs per program
    block_n: int  # keys per inner iteration
    block_d: int  # head dim padded to a power of two
    num_warps: int


LARGE_GRID = 512
"""Programs along (request, KV head) from which a launch takes the large-grid tiles below."""


def attention_config(
    dtype: torch.dtype, head_dim: int, group: int, max_rows: int, programs: int = 0
) -> AttentionConfig:
    """Tiles for a launch: M covers a small tree's rows x group in one block (16..64); float32
    and head dims > 128 halve the key tile so K/V tiles fit A100 shared memory (<= 163 KiB).

    ``programs`` = requests x KV heads. From ``LARGE_GRID`` on (16-bit, head dim <= 128) a
    program runs 4 warps, and a 64-row M tile takes 32 keys per iteration: measured on one H200
    at Llama-3.1-8B heads, B = 256 at 1,024 cached tokens (``scripts/gpu_check.sh --parts
    tiles``, docs/bench/2026-12-04/gpu/), 8 warps made 32-row tiles 1.5-1.6x slower (0.72 ms
    against 0.45) and 64 x 64 tiles 1.5x slower than 64 x 32 with 4 warps; at B = 16 (128
    programs) 8 warps were as fast or faster, so small grids keep them.
    """
    block_d = max(16, 1 << (head_dim - 1).bit_length())
    block_m = min(64, max(16, 1 << (max_rows * group - 1).bit_length()))
    wide = dtype == torch.float32 or block_d > 128
    block_n, warps = 32 if wide else 64, 4 if block_d <= 64 else 8
    if programs >= LARGE_GRID and not wide:
        warps = 4
        block_n = 32 if block_m == 64 else block_n
    return AttentionConfig(block_m, block_n, block_d, warps)


def _check_inputs(
    q: Tensor, k_new: Tensor, v_new: Tensor, k_pool: Tensor, v_pool: Tensor,
    meta: TreeAttentionMetadata, scale: float, window: int | None,
) -> None:  # fmt: skip
    if q.dim() != 3 or k_new.dim() != 3 or k_pool.dim() != 3:
        raise ValueError(
            f"q, k_new, k_pool must be 3-D [rows, heads, D], got {tuple(q.shape)}, "
            f"{tuple(k_new.shape)}, {tuple(k_pool.shape)}"
        )
    r, hq, d = q.shape
    hkv = k_new.shape[1]
    if k_new.shape != (r, hkv, d) or v_new.shape != k_new.shape:
        raise ValueError(
            f"k_new and v_new must be [R={r}, Hkv, D={d}], got {tuple(k_new.shape)} and "
            f"{tuple(v_new.shape)}"
        )
    if k_pool.shape[1:] != (hkv, d) or v_pool.shape != k_pool.shape:
        raise ValueError(
            f"k_pool and v_pool must be [num_slots, Hkv={hkv}, D={d}], got "
            f"{tuple(k_pool.shape)} and {tuple(v_pool.shape)}"
        )
    if hkv == 0 or hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if not 0 < d <= MAX_HEAD_DIM:
        raise ValueError(f"head dim must be in [1, {MAX_HEAD_DIM}], got {d}")
    for name, t in (("k_new", k_new), ("v_new", v_new), ("k_pool", k_pool), ("v_pool", v_pool)):
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}, q is {q.dtype} on {q.device}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be one of {SUPPORTED_DTYPES}, got {q.dtype}")
    if meta.num_rows != r or meta.device != q.device:
        raise ValueError(
            f"metadata describes {meta.num_rows} rows on {meta.device}, q has {r} on {q.device}"
        )
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0, got {scale}")
    if window is not None and window < 1:
        raise ValueError(f"window must be None or >= 1, got {window}")


def _check_strides(
    q: Tensor, k_new: Tensor, v_new: Tensor, k_pool: Tensor, v_pool: Tensor,
    meta: TreeAttentionMetadata,
) -> None:  # fmt: skip
    if not q.is_contiguous():
        raise ValueError(f"q must be contiguous, got strides {q.stride()}")
    for name, k, v in (("k_new/v_new", k_new, v_new), ("k_pool/v_pool", k_pool, v_pool)):
        if k.stride() != v.stride() or k.stride(2) != 1:
            raise ValueError(
                f"{name} must share strides with unit stride in D, got {k.stride()} {v.stride()}"
            )
    for name, t in (
        ("cu_rows", meta.cu_rows),
        ("positions", meta.positions),
        ("cache_len", meta.cache_len),
        ("tree_bits", meta.tree_bits),
        ("causal", meta.causal),
    ):
        if not t.is_contiguous():
            raise ValueError(f"metadata {name} must be contiguous")
    if meta.req_to_slot.stride(1) != 1:
        raise ValueError(f"req_to_slot rows must be contiguous, got {meta.req_to_slot.stride()}")


def tree_attention_triton(
    q: Tensor,  # [R, Hq, D] fp16/bf16/fp32, contiguous
    k_new: Tensor,  # [R, Hkv, D], unit stride in D, same strides as v_new
    v_new: Tensor,  # [R, Hkv, D]
    k_pool: Tensor,  # [num_slots, Hkv, D], unit stride in D, same strides as v_pool
    v_pool: Tensor,  # [num_slots, Hkv, D]
    meta: TreeAttentionMetadata,
    scale: float,
    window: int | None = None,
    config: AttentionConfig | None = None,
) -> Tensor:  # [R, Hq, D], q's dtype
    """Launch the Triton kernel after validating every shape, dtype and stride. ``config``
    overrides :func:`attention_config`'s tiles (tile sweeps; any valid tiles give the same
    function)."""
    _check_inputs(q, k_new, v_new, k_pool, v_pool, meta, scale, window)
    _check_strides(q, k_new, v_new, k_pool, v_pool, meta)
    out = torch.empty_like(q)
    r, hq, d = q.shape
    hkv = k_new.shape[1]
    group = hq // hkv
    if r == 0:
        return out
    from echo_kernels.triton_kernels import tree_attention_kernel

    if config is not None and (
        config.block_d < d or min(config.block_m, config.block_n) < 16 or config.num_warps < 1
    ):
        raise ValueError(f"tiles {config} cannot cover head dim {d} (block_m, block_n >= 16)")
    cfg = (
        config
        if config is not None
        else attention_config(q.dtype, d, group, meta.max_rows, meta.batch_size * hkv)
    )
    grid = (meta.batch_size, -(-meta.max_rows * group // cfg.block_m), hkv)
    tree_attention_kernel[grid](
        q, k_new, v_new, k_pool, v_pool, out,
        meta.cu_rows, meta.positions, meta.cache_len, meta.req_to_slot, meta.tree_bits,
        meta.causal.view(torch.int8),
        q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1),
        k_pool.stride(0), k_pool.stride(1), meta.req_to_slot.stride(0),
        meta.tree_bits.shape[1], scale * LOG2_E, 0 if window is None else window,
        HEAD_DIM=d, GROUP=group, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d,
        HAS_WINDOW=window is not None,
        UPCAST=interpreting() and q.dtype == torch.bfloat16,
        DOT_PRECISION="ieee",
        num_warps=cfg.num_warps,
    )  # fmt: skip
    return out


def tree_attention(
    q: Tensor,  # [R, Hq, D] fp16/bf16/fp32, packed query rows (RoPE already applied)
    k_new: Tensor,  # [R, Hkv, D], keys of the same rows (RoPE applied)
    v_new: Tensor,  # [R, Hkv, D], values of the same rows
    k_pool: Tensor,  # [num_slots, Hkv, D], this layer's cached keys
    v_pool: Tensor,  # [num_slots, Hkv, D], this layer's cached values
    meta: TreeAttentionMetadata,
    *,
    scale: float | None = None,
    window: int | None = None,
    backend: Backend = "auto",
) -> Tensor:  # [R, Hq, D], q's dtype
    """Attention of every packed row over its request's prefix and visible new rows.

    ``scale`` defaults to ``D ** -0.5``; ``window`` (sliding-window layers) keeps keys with
    ``position(query) - position(key) < window``. Query head ``h`` reads KV head
    ``h // (Hq // Hkv)`` (grouped-query attention). Softmax is accumulated in float32 for every
    input dtype. ``backend``: see :mod:`echo_kernels.backend`.
    """
    s = 1.0 / math.sqrt(max(q.shape[-1], 1)) if scale is None else scale
    if use_triton(backend, q.device):
        return tree_attention_triton(q, k_new, v_new, k_pool, v_pool, meta, s, window)
    _check_inputs(q, k_new, v_new, k_pool, v_pool, meta, s, window)
    return tree_attention_reference(q, k_new, v_new, k_pool, v_pool, meta, s, window)
