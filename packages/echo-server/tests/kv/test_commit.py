"""Commit after verification: roots and accepted paths stay, in depth order; the rest is freed."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import echo_kernels.kv_commit as kernels_commit
from echo_core.tree import make_tree
from echo_server.kv import KVCapacityError, KVPool, commit_verified, kept_rows
from echo_server.model.config import ModelConfig

CONFIG = ModelConfig(
    arch="llama",
    vocab_size=10,
    hidden_size=8,
    intermediate_size=8,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    rms_norm_eps=1e-6,
    rope_theta=1e4,
    max_position=32,
    tie_word_embeddings=True,
)


def test_worked_example_from_the_docstring() -> None:
    # Nodes [a, b, c], c a child of a; path [a, c] accepted: keep root, a, c; free b.
    tree = make_tree([[(1, -1, -0.1), (2, -1, -0.1), (3, 0, -0.1)]])
    keep = kept_rows(tree, torch.tensor([[0, 2]]), torch.tensor([2]))
    assert keep.tolist() == [True, True, False, True]


def test_commit_appends_root_and_path_and_frees_the_rest() -> None:
    pool = KVPool(CONFIG, num_slots=20, max_requests=3)
    handles = [pool.add_request() for _ in range(3)]
    pool.append(handles, pool.allocate(3), [1, 2, 0])
    tree = make_tree(
        [
            [(1, -1, -0.1), (2, -1, -0.1), (3, 1, -0.1), (4, 2, -0.1)],  # accept 1 -> 2 -> 3
            [],  # zero nodes: only its root
            [(5, -1, -0.1), (6, -1, -0.1)],  # nothing accepted
        ]
    )
    write = pool.allocate(tree.batch_size + tree.num_nodes)  # 10 rows
    free_before = pool.num_free
    accepted = torch.tensor([[1, 2, 3], [-1, -1, -1], [-1, -1, -1]])
    commit_verified(pool, handles, tree, write, accepted, torch.tensor([3, 0, 0]))
    rows = write.tolist()
    assert pool.request_slots(handles[0]).tolist()[1:] == [rows[0], rows[2], rows[3], rows[4]]
    assert pool.request_slots(handles[1]).tolist()[2:] == [rows[5]]
    assert pool.request_slots(handles[2]).tolist() == [rows[6]]
    assert pool.num_free == free_before + 3  # rows 1 (node 0), 7 and 8 (request 2's nodes)


def test_commit_rejects_mismatched_slots() -> None:
    pool = KVPool(CONFIG, num_slots=8, max_requests=1)
    h = pool.add_request()
    tree = make_tree([[(1, -1, -0.1)]])
    with pytest.raises(ValueError, match=r"write_slots must be \[B \+ N = 2\]"):
        commit_verified(pool, [h], tree, pool.allocate(3), torch.tensor([[0]]), torch.tensor([1]))


def test_commit_on_a_cpu_pool_runs_the_reference_on_the_pool_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    reference = kernels_commit.commit_reference

    def spy(table: torch.Tensor, rows: torch.Tensor, *rest: Any) -> kernels_commit.CommitResult:
        calls.append((table, rows))
        return reference(table, rows, *rest)

    def fail(*args: Any) -> kernels_commit.CommitResult:
        raise AssertionError("the Triton commit ran for a CPU pool")

    monkeypatch.setattr(kernels_commit, "commit_reference", spy)
    monkeypatch.setattr(kernels_commit, "commit_triton", fail)
    pool = KVPool(CONFIG, num_slots=20, max_requests=4)
    handles = [pool.add_request() for _ in range(4)][2:]  # table rows 2 and 3, not 0 and 1
    tree = make_tree([[(1, -1, -0.1), (2, 0, -0.1)], [(3, -1, -0.1)]])
    write = pool.allocate(5)
    commit_verified(
        pool, handles, tree, write, torch.tensor([[0, 1], [-1, -1]]), torch.tensor([2, 0])
    )
    assert len(calls) == 1
    assert calls[0][0] is pool.slot_table  # written in place, no gathered copy
    assert calls[0][1].tolist() == [2, 3]
    rows = write.tolist()
    assert pool.request_slots(handles[0]).tolist() == rows[:3]
    assert pool.request_slots(handles[1]).tolist() == [rows[3]]
    assert pool.num_free == 20 - 4  # node 0 of request 1 was freed


def test_a_triton_decision_reaches_the_commit_kernel_launcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    launched: list[torch.device] = []
    reference = kernels_commit.commit_reference

    def launcher(*args: Any) -> kernels_commit.CommitResult:
        launched.append(args[0].device)
        return reference(*args)

    monkeypatch.setattr(kernels_commit, "use_triton", lambda choice, device: True)
    monkeypatch.setattr(kernels_commit, "commit_triton", launcher)
    pool = KVPool(CONFIG, num_slots=8, max_requests=1)
    h = pool.add_request()
    tree = make_tree([[(1, -1, -0.1)]])
    commit_verified(pool, [h], tree, pool.allocate(2), torch.tensor([[0]]), torch.tensor([1]))
    assert launched == [torch.device("cpu")]
    assert pool.cache_len(h) == 2


def test_commit_past_max_context_is_refused_before_any_write() -> None:
    pool = KVPool(CONFIG, num_slots=40, max_requests=1, max_context=3)
    h = pool.add_request()
    pool.append([h], pool.allocate(1), [1])
    before = pool.slot_table.clone()
    tree = make_tree([[(1, -1, -0.1), (2, 0, -0.1)]])
    with pytest.raises(KVCapacityError, match="would reach 4 tokens, the maximum is 3"):
        commit_verified(
            pool, [h], tree, pool.allocate(3), torch.tensor([[0, 1]]), torch.tensor([2])
        )
    assert torch.equal(pool.slot_table, before)
    assert pool.cache_len(h) == 1
