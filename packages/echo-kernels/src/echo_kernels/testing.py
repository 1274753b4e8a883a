"""Test and benchmark fixtures; production code never imports this module.

Seeded synthetic inputs for the kernels' tests and benchmarks (every tier, CPU and GPU).

The pool holds every request's cached prefix at scattered slots (a random permutation), so the
slot indirection is exercised; the new rows get their own slots after the prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import TreeBatch, make_tree

UNUSED_SLOT = -1
"""Table entries past a request's cached prefix (never read by attention)."""


@dataclass(frozen=True, slots=True)
class KVPool:
    """One layer's KV pool with a batch's slot table."""

    k_pool: Tensor  # [num_slots, Hkv, D]
    v_pool: Tensor  # [num_slots, Hkv, D]
    req_to_slot: Tensor  # [B, max_ctx] int64, UNUSED_SLOT past cache_len[b]
    cache_len: Tensor  # [B] int64
    row_slots: Tensor  # [R] int64, free slots reserved for the new rows

    def to(self, dtype: torch.dtype) -> KVPool:
        """The same pool with K/V cast to ``dtype`` (tables unchanged)."""
        return KVPool(
            self.k_pool.to(dtype), self.v_pool.to(dtype), self.req_to_slot, self.cache_len,
            self.row_slots,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class QueryRows:
    """Projections of the new rows."""

    q: Tensor  # [R, Hq, D]
    k_new: Tensor  # [R, Hkv, D]
    v_new: Tensor  # [R, Hkv, D]

    def to(self, dtype: torch.dtype) -> QueryRows:
        """The same rows cast to ``dtype``."""
        return QueryRows(self.q.to(dtype), self.k_new.to(dtype), self.v_new.to(dtype))


def random_pool(
    generator: torch.Generator,
    cache_len: list[int],
    new_rows: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    headroom: int = 0,
) -> KVPool:
    """A pool of ``sum(cache_len) + new_rows`` slots on the generator's device.

    ``req_to_slot`` has ``max(cache_len) + headroom`` columns (headroom: room to commit).
    """
    dev = generator.device
    cached = sum(cache_len)
    num_slots = cached + new_rows
    perm = torch.randperm(num_slots, generator=generator, device=dev)
    shape = (num_slots, num_kv_heads, head_dim)
    k_pool = torch.randn(shape, generator=generator, device=dev).to(dtype)
    v_pool = torch.randn(shape, generator=generator, device=dev).to(dtype)
    max_ctx = max(cache_len, default=0) + headroom
    table = torch.full((len(cache_len), max_ctx), UNUSED_SLOT, dtype=torch.int64, device=dev)
    start = 0
    for b, n in enumerate(cache_len):
        table[b, :n] = perm[start : start + n]
        start += n
    lens = torch.tensor(cache_len, dtype=torch.int64, device=dev)
    return KVPool(k_pool, v_pool, table, lens, perm[cached:].clone())


def random_rows(
    generator: torch.Generator,
    rows: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
) -> QueryRows:
    """Standard-normal q, k, v for ``rows`` new rows on the generator's device."""
    dev = generator.device

    def draw(heads: int) -> Tensor:
        return torch.randn(rows, heads, head_dim, generator=generator, device=dev).to(dtype)

    return QueryRows(draw(num_q_heads), draw(num_kv_heads), draw(num_kv_heads))


def random_tree_of_sizes(
    generator: torch.Generator, sizes: list[int], vocab: int = 100
) -> TreeBatch:
    """A CPU tree batch with exactly ``sizes[b]`` nodes in request b, each node's parent uniform
    over the root and the earlier nodes (so depths grow like a random recursive tree)."""
    requests = []
    for n in sizes:
        idx = torch.arange(n)
        parent = (torch.rand(n, generator=generator) * (idx + 1)).floor().to(torch.int64) - 1
        tokens = torch.randint(0, vocab, (n,), generator=generator)
        requests.append([(int(t), int(p), -0.5) for t, p in zip(tokens, parent, strict=True)])
    return make_tree(requests)
