"""echo-server on CUDA tensors: acceptance and KV commit dispatch to echo-kernels' Triton kernels.

The CPU side of the same dispatch (echo-core's / echo-kernels' references) is tested in
packages/echo-server/tests/engine/test_acceptance.py and tests/kv/test_commit.py. Needs
echo-server's dependencies (structlog, ...) next to torch and triton.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

import echo_kernels.acceptance as kernels_acceptance
import echo_kernels.kv_commit as kernels_commit
from echo_core.random_trees import random_tree_batch
from echo_core.sampling import SamplingParams
from echo_core.tree import make_tree
from echo_server.engine.acceptance import accept
from echo_server.engine.request import RequestState
from echo_server.kv import KVPool, commit_verified
from echo_server.model.config import ModelConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda")
CONFIG = ModelConfig(
    arch="llama", vocab_size=10, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2,
    num_kv_heads=1, head_dim=4, rms_norm_eps=1e-6, rope_theta=1e4, max_position=64,
    tie_word_embeddings=True,
)  # fmt: skip


def states(params: Sequence[SamplingParams], seed: int = 0) -> list[RequestState]:
    """Stand-ins with what acceptance reads: ``params`` and a seeded ``generator``."""
    return [
        cast(RequestState, SimpleNamespace(params=p, generator=torch.Generator().manual_seed(i)))
        for i, p in enumerate(params, seed)
    ]


def spy(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, calls: list[str]) -> None:
    real: Callable[..., Any] = getattr(module, name)

    def wrapped(*args: Any) -> Any:
        calls.append(name)
        return real(*args)

    monkeypatch.setattr(module, name, wrapped)


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "stochastic"])
def test_acceptance_of_cuda_logits_runs_the_triton_kernel(
    monkeypatch: pytest.MonkeyPatch, greedy: bool
) -> None:
    g = torch.Generator().manual_seed(0)
    tree = random_tree_batch(g, batch_size=16, max_nodes=12, vocab=6)  # on the CPU, as drafted
    logits = (torch.randn(tree.batch_size + tree.num_nodes, 50, generator=g) * 3).to(CUDA)
    params = [SamplingParams(temperature=0.0 if greedy else 0.9, top_k=20)] * tree.batch_size
    want = accept(tree, logits, states(params), backend="torch")  # echo-core's rule, on CUDA
    calls: list[str] = []
    spy(monkeypatch, kernels_acceptance, "greedy_accept_triton", calls)
    spy(monkeypatch, kernels_acceptance, "stochastic_accept_triton", calls)
    got = accept(tree, logits, states(params))
    assert calls == ["greedy_accept_triton" if greedy else "stochastic_accept_triton"]
    assert got.num_accepted.device == tree.device  # back where commit and emit read it
    for name in ("accepted_nodes", "num_accepted", "bonus_token"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_commit_on_a_cuda_pool_runs_the_triton_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    spy(monkeypatch, kernels_commit, "commit_triton", calls)
    tree = make_tree([[(1, -1, -0.1), (2, 0, -0.1), (3, -1, -0.1)], [], [(4, -1, -0.1)]])
    nodes, num = torch.tensor([[0, 1], [-1, -1], [-1, -1]]), torch.tensor([2, 0, 0])
    tables = []
    for device in (CUDA, torch.device("cpu")):
        pool = KVPool(CONFIG, num_slots=30, max_requests=5, device=device)
        handles = [pool.add_request() for _ in range(5)][1:4]
        pool.append(handles, pool.allocate(6), [1, 2, 3])
        commit_verified(pool, handles, tree, pool.allocate(7), nodes, num)
        assert [pool.cache_len(h) for h in handles] == [4, 3, 4]
        assert pool.num_free == 30 - 6 - 5  # two rejected rows came back
        tables.append(pool.slot_table.cpu())
    assert calls == ["commit_triton"]  # the CUDA pool only
    assert torch.equal(tables[0], tables[1])
