"""store_cache_cpu: a scatter of K/V rows into pool slots, exact."""

from __future__ import annotations

import pytest
import torch

import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel)

OPS = torch.ops.sgl_kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_cache_scatters_rows_from_a_strided_qkv_split(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    tokens, heads, dim, pool = 5, 3, 8, 11
    qkv = torch.randn(tokens, 3 * heads * dim, generator=gen).to(dtype)
    k = qkv[:, heads * dim : 2 * heads * dim].view(tokens, heads, dim)  # strided, like SGLang's
    v = qkv[:, 2 * heads * dim :].view(tokens, heads, dim)
    k_cache = torch.zeros(pool, heads, dim, dtype=dtype)
    v_cache = torch.zeros(pool, heads, dim, dtype=dtype)
    indices = torch.tensor([7, 1, 9, 4, 2], dtype=torch.int32)
    OPS.store_cache_cpu(k, v, k_cache, v_cache, indices, heads * dim)
    assert torch.equal(k_cache[indices.long()], k)
    assert torch.equal(v_cache[indices.long()], v)
    untouched = [i for i in range(pool) if i not in indices.tolist()]
    assert not k_cache[untouched].any()
    assert not v_cache[untouched].any()


def test_store_cache_rejects_an_index_count_that_does_not_match() -> None:
    cache = torch.zeros(4, 2, 2)
    with pytest.raises(ValueError, match="indices"):
        OPS.store_cache_cpu(
            torch.ones(2, 2, 2), torch.ones(2, 2, 2), cache, cache.clone(), torch.tensor([1]), 4
        )
