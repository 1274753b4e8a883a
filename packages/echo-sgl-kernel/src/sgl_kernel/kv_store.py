"""Writing new keys and values into the token-indexed KV pool: ``store_cache_cpu``.

SGLang's ``set_kv_buffer`` calls it on its CPU-kernel path when K and V rows have one width.
Every token t of the batch lands in pool slot indices[t]:

    k_cache.view(-1, row_dim)[indices[t]] = k.view(-1, row_dim)[t]   (and the same for v)
"""

from __future__ import annotations

import torch

from sgl_kernel.library import register

__all__ = ["store_cache_cpu"]


def _rows(t: torch.Tensor, row_dim: int, name: str) -> torch.Tensor:
    if t.numel() % row_dim != 0:
        raise ValueError(f"{name} of shape {tuple(t.shape)} does not split into rows of {row_dim}")
    return t.reshape(-1, row_dim)


def store_cache_cpu(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    row_dim: int,
) -> None:
    """Scatter k, v ([T, heads, dim], any strides) into k_cache, v_cache ([pool, heads, dim]).

    indices: [T] int32/int64 pool slots; row_dim = heads * dim. Values are cast to the cache
    dtype. The caches must be contiguous (their rows are viewed as [pool, row_dim]).
    """
    k_rows, v_rows = _rows(k, row_dim, "k"), _rows(v, row_dim, "v")
    slots = indices.reshape(-1).long()
    if k_rows.shape[0] != slots.numel() or v_rows.shape[0] != slots.numel():
        raise ValueError(
            f"{slots.numel()} indices for {k_rows.shape[0]} key and {v_rows.shape[0]} value rows"
        )
    for rows, cache, name in ((k_rows, k_cache, "k_cache"), (v_rows, v_cache, "v_cache")):
        if not cache.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        cache.view(-1, row_dim).index_copy_(0, slots, rows.to(cache.dtype))


register(
    "store_cache_cpu(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor indices, "
    "int row_dim) -> ()",
    store_cache_cpu,
)
