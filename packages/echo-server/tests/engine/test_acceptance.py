"""The engine's acceptance step: echo-core's rules through echo-kernels' backend dispatch.

CPU logits run echo-core's reference itself (checked against a direct call, with the Triton
launchers made to fail if reached); a forced dispatch decision shows the step hands CUDA-like
calls to the Triton launchers. The real CUDA run is tests/gpu/test_server_kernels_gpu.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from torch import Tensor

import echo_kernels.acceptance as kernels_acceptance
from echo_core.acceptance import AcceptResult, greedy_accept
from echo_core.acceptance_stochastic import AcceptUniforms, stochastic_accept
from echo_core.random_trees import random_tree_batch
from echo_core.sampling import SamplingParams, stack_sampling_params, target_probs
from echo_core.tree import TreeBatch
from echo_kernels import backend
from echo_server.engine.acceptance import accept
from echo_server.engine.request import RequestState

VOCAB = 5
GREEDY = SamplingParams(temperature=0.0)
HOT = SamplingParams(temperature=0.8, top_k=4, seed=1)


def states(params: Sequence[SamplingParams], seed: int = 0) -> list[RequestState]:
    """Stand-ins with what acceptance reads: ``params`` and a seeded ``generator``."""
    return [
        cast(
            RequestState,
            SimpleNamespace(params=p, generator=torch.Generator().manual_seed(seed + i)),
        )
        for i, p in enumerate(params)
    ]


def problem(seed: int, batch: int = 5) -> tuple[TreeBatch, Tensor]:
    g = torch.Generator().manual_seed(seed)
    tree = random_tree_batch(g, batch_size=batch, max_nodes=7, vocab=VOCAB)
    logits = torch.randn(tree.batch_size + tree.num_nodes, VOCAB, generator=g) * 3
    return tree, logits


def same(got: AcceptResult, want: AcceptResult) -> None:
    assert torch.equal(got.accepted_nodes, want.accepted_nodes)
    assert torch.equal(got.num_accepted, want.num_accepted)
    assert torch.equal(got.bonus_token, want.bonus_token)


@pytest.fixture
def no_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail loudly if a Triton launcher is reached."""

    def fail(*args: Any, **kwargs: Any) -> AcceptResult:
        raise AssertionError("the Triton launcher ran for CPU tensors")

    monkeypatch.setattr(kernels_acceptance, "greedy_accept_triton", fail)
    monkeypatch.setattr(kernels_acceptance, "stochastic_accept_triton", fail)


@pytest.mark.usefixtures("no_triton")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_on_cpu_is_echo_cores_reference(seed: int) -> None:
    tree, logits = problem(seed)
    got = accept(tree, logits, states([GREEDY] * tree.batch_size))
    same(got, greedy_accept(tree, logits.argmax(dim=-1)))


@pytest.mark.usefixtures("no_triton")
@pytest.mark.parametrize("seed", [0, 3])
def test_stochastic_on_cpu_is_echo_cores_reference_with_per_request_uniforms(seed: int) -> None:
    tree, logits = problem(seed)
    params = [HOT, GREEDY, HOT, SamplingParams(temperature=1.2, top_p=0.9), GREEDY]
    got = accept(tree, logits, states(params, seed))
    # The same rule by hand: per-row target distributions, uniforms drawn request by request.
    counts = (tree.nodes_per_request() + 1).tolist()
    per_row = [p for p, c in zip(params, counts, strict=True) for _ in range(c)]
    probs = target_probs(logits, *stack_sampling_params(per_row, logits.device))
    gens = [torch.Generator().manual_seed(seed + i) for i in range(len(params))]
    node = torch.cat([torch.rand(c - 1, generator=g) for g, c in zip(gens, counts, strict=True)])
    bonus = torch.cat([torch.rand(1, generator=g) for g in gens])
    sampled = torch.zeros(tree.num_nodes, dtype=torch.bool)
    same(got, stochastic_accept(tree, probs, sampled, None, AcceptUniforms(node, bonus)))


def test_auto_dispatch_picks_triton_exactly_for_cuda_with_triton(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backend, "triton_installed", lambda: True)
    assert backend.use_triton("auto", torch.device("cuda"))
    assert backend.use_triton("auto", torch.device("cuda:1"))
    assert not backend.use_triton("auto", torch.device("cpu"))
    assert not backend.use_triton("torch", torch.device("cuda"))
    monkeypatch.setattr(backend, "triton_installed", lambda: False)
    assert not backend.use_triton("auto", torch.device("cuda"))  # CUDA without triton


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "stochastic"])
def test_a_triton_decision_reaches_the_triton_launchers(
    monkeypatch: pytest.MonkeyPatch, greedy: bool
) -> None:
    # Pretend the dispatch chose Triton (as for CUDA logits); the launchers are stood in for by
    # echo-core's reference so the step's result can still be checked on this CPU.
    decisions: list[tuple[str, torch.device]] = []
    launched: list[str] = []

    def decide(choice: backend.Backend, device: torch.device) -> bool:
        decisions.append((choice, device))
        return True

    def greedy_launcher(tree: TreeBatch, argmax: Tensor) -> AcceptResult:
        launched.append("greedy")
        return greedy_accept(tree, argmax)

    def stochastic_launcher(
        tree: TreeBatch, probs: Tensor, sampled: Tensor, draft: Tensor | None, u: AcceptUniforms
    ) -> AcceptResult:
        launched.append("stochastic")
        return stochastic_accept(tree, probs, sampled, draft, u)

    monkeypatch.setattr(kernels_acceptance, "use_triton", decide)
    monkeypatch.setattr(kernels_acceptance, "greedy_accept_triton", greedy_launcher)
    monkeypatch.setattr(kernels_acceptance, "stochastic_accept_triton", stochastic_launcher)
    tree, logits = problem(4)
    params = [GREEDY if greedy else HOT] * tree.batch_size
    got = accept(tree, logits, states(params))
    assert decisions == [("auto", torch.device("cpu"))]
    assert launched == ["greedy" if greedy else "stochastic"]
    if greedy:
        same(got, greedy_accept(tree, logits.argmax(dim=-1)))


def test_forcing_the_torch_backend_never_asks_for_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "triton_installed", lambda: True)
    tree, logits = problem(5)
    got = accept(tree, logits, states([GREEDY] * tree.batch_size), backend="torch")
    same(got, greedy_accept(tree, logits.argmax(dim=-1)))
