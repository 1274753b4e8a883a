"""KV pool: sizing, slot allocation, request table, admission, attention metadata."""

from __future__ import annotations

import pytest
import torch

from echo_server.kv import (
    NULL_SLOT,
    KVCapacityError,
    KVPool,
    KVStateError,
    RequestHandle,
    SlotAllocator,
    slots_for_budget,
)
from echo_server.model.config import ModelConfig


def smollm_like(max_position: int = 64) -> ModelConfig:
    return ModelConfig(
        arch="llama",
        vocab_size=100,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=1e5,
        max_position=max_position,
        tie_word_embeddings=True,
    )


def test_budget_worked_example_from_the_docstring() -> None:
    assert smollm_like().kv_bytes_per_token(4) == 46_080
    assert slots_for_budget(smollm_like(), 1 << 30, torch.float32) == 23_300
    assert slots_for_budget(smollm_like(), 1 << 30, torch.bfloat16) == 46_602


def test_budget_too_small_names_both_sizes() -> None:
    with pytest.raises(KVCapacityError, match="1000 bytes is below 2 slots of 46080"):
        slots_for_budget(smollm_like(), 1000, torch.float32)


def test_for_budget_preallocates_storage_of_that_size() -> None:
    pool = KVPool.for_budget(smollm_like(), 46_080 * 11, dtype=torch.float32)
    assert pool.num_slots == 10
    assert pool.storage.shape == (30, 2, 11, 3, 64)
    assert pool.storage.numel() * 4 <= 46_080 * 11


def test_allocator_hands_out_distinct_slots_and_never_the_null_slot() -> None:
    alloc = SlotAllocator(5)
    first = alloc.allocate(3)
    assert first.tolist() == [1, 2, 3]
    rest = alloc.allocate(2)
    assert NULL_SLOT not in first.tolist() + rest.tolist()
    assert alloc.num_free == 0
    with pytest.raises(KVCapacityError, match="need 1 KV slots, only 0 of 5 are free"):
        alloc.allocate(1)
    alloc.free(first[1:])
    assert sorted(alloc.allocate(2).tolist()) == [2, 3]


@pytest.mark.parametrize(
    ("slots", "error"),
    [([2, 2], "double free"), ([4], "double free"), ([0], "outside"), ([9], "outside")],
)
def test_bad_frees_raise_and_change_nothing(slots: list[int], error: str) -> None:
    alloc = SlotAllocator(5)
    alloc.allocate(3)
    with pytest.raises(KVStateError, match=error):
        alloc.free(torch.tensor(slots))
    assert alloc.num_free == 2


def test_admission_waits_when_full_and_rejects_what_can_never_fit() -> None:
    pool = KVPool(smollm_like(max_position=64), num_slots=40, max_requests=2)
    assert pool.can_admit(40)
    assert not pool.can_admit(41)
    with pytest.raises(KVCapacityError, match="needs 65 tokens of context, the maximum is 64"):
        pool.check_fits(65)
    small = KVPool(smollm_like(max_position=64), num_slots=20, max_requests=2)
    assert small.why_never_fits(30) == "request needs 30 KV slots, the pool has 20 in total"
    assert small.why_never_fits(20) is None
    first = small.add_request()
    small.append([first], small.allocate(15), [15])
    assert not small.can_admit(6)  # fits the pool, not right now: the request waits
    small.release_request(first)
    assert small.can_admit(6)


def test_request_rows_run_out_with_a_clear_error() -> None:
    pool = KVPool(smollm_like(), num_slots=8, max_requests=1)
    pool.add_request()
    assert not pool.can_admit(1)
    with pytest.raises(KVCapacityError, match="all 1 request rows are in use"):
        pool.add_request()


def test_append_grows_each_request_in_order_and_release_frees_everything() -> None:
    pool = KVPool(smollm_like(), num_slots=16, max_requests=3)
    a, b = pool.add_request(), pool.add_request()
    pool.append([a, b], torch.tensor([5, 6, 7, 8, 9]), [2, 3])
    pool.append([b, a], torch.tensor([10, 11]), [1, 1])
    assert pool.request_slots(a).tolist() == [5, 6, 11]
    assert pool.request_slots(b).tolist() == [7, 8, 9, 10]
    with pytest.raises(KVStateError, match="unknown request handle 2"):
        pool.cache_len(RequestHandle(2))


def test_append_past_max_context_is_refused() -> None:
    pool = KVPool(smollm_like(max_position=4), num_slots=8, max_requests=1)
    h = pool.add_request()
    with pytest.raises(KVCapacityError, match="would reach 5 tokens, the maximum is 4"):
        pool.append([h], pool.allocate(5), [5])


def test_release_returns_slots_and_clears_the_row() -> None:
    pool = KVPool(smollm_like(), num_slots=8, max_requests=1)
    h = pool.add_request()
    pool.append([h], pool.allocate(6), [6])
    pool.release_request(h)
    assert pool.num_free == 8
    assert int(pool.slot_table.abs().sum()) == 0
    assert pool.add_request() == h


def test_attention_batch_reads_the_table_and_cache_lengths() -> None:
    pool = KVPool(smollm_like(), num_slots=16, max_requests=2)
    a, b = pool.add_request(), pool.add_request()
    pool.append([a, b], pool.allocate(5), [3, 2])
    write = pool.allocate(3)
    batch = pool.attention_batch([b, a], [1, 2], write)
    assert batch.cache_len_host == (2, 3)
    assert batch.req_rows.tolist() == [b, a]
    assert batch.cu_rows.tolist() == [0, 1, 3]
    assert batch.max_context == 5
