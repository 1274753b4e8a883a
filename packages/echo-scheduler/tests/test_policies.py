"""Invariants every policy keeps, driven exactly as the engine drives them."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_core.tree import empty_tree, select_nodes
from echo_gating.policy import GateMode, GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.errors import PolicyError
from echo_scheduler.interface import BasePolicy, Policy, StepBatch
from echo_scheduler.policies import (
    FLOORED_NAMES,
    POLICY_NAMES,
    PlainPolicy,
    make_policy,
    policy_names,
    policy_spec,
    register_policy,
)
from echo_scheduler.policies.registry import _REGISTRY
from echo_scheduler.simulator import drive
from echo_scheduler.workloads import SyntheticStep, SyntheticWorkload

FAST = settings(max_examples=60, deadline=None)
SMALL = PolicyConfig(max_depth=5, max_width=4)
GATES = {
    "echo": GatePolicy.sparse({2: 0.3, 4: 0.1}, max_depth=5),
    "echo_dense": GatePolicy.dense({1: 0.2, 2: 0.2, 3: 0.1, 4: 0.1}),
    "echo_fixed": GatePolicy.fixed(0.2, max_depth=5),
    "echo_noledger": GatePolicy.sparse({2: 0.3, 4: 0.1}, max_depth=5),
}


def _steps(seed: int, batch: int, count: int = 1) -> list[SyntheticStep]:
    return SyntheticWorkload.llama().sample(batch, count, torch.Generator().manual_seed(seed))


def _policy(name: str) -> BasePolicy:
    return make_policy(name, SMALL, gate=GATES.get(name))


@FAST
@given(
    name=st.sampled_from(POLICY_NAMES),
    seed=st.integers(0, 10_000),
    batch=st.integers(0, 6),
    budget=st.integers(0, 40),
)
def test_selection_is_legal_for_every_policy(name: str, seed: int, batch: int, budget: int) -> None:
    step = _steps(seed, batch)[0]
    run = drive(_policy(name), step, budget)  # raises on an illegal plan or selection
    tree = select_nodes(run.pool, run.keep)
    tree.validate()
    assert tree.num_nodes <= budget
    assert bool((tree.nodes_per_request() <= step.max_nodes).all())
    assert tree.max_depth() <= max(SMALL.max_depth, SMALL.base_depth, len(SMALL.static_branching))


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_zero_budget_decodes_plainly_without_drafting(name: str) -> None:
    run = drive(_policy(name), _steps(1, 5)[0], budget=0)
    assert run.depths == 0
    assert run.pool.num_nodes == 0
    assert run.keep.numel() == 0


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_requests_that_must_not_draft_are_legal(name: str) -> None:
    step = _steps(2, 4)[0]
    blocked = step.with_max_nodes(torch.zeros(4, dtype=torch.int64))
    run = drive(_policy(name), blocked, budget=20)
    assert run.pool.num_nodes == 0
    assert select_nodes(run.pool, run.keep).nodes_per_request().tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_empty_batch_is_legal(name: str) -> None:
    run = drive(_policy(name), _steps(3, 0)[0], budget=10)
    assert run.keep.numel() == 0


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_same_inputs_give_the_same_tree(name: str) -> None:
    step = _steps(4, 6)[0]
    first, second = drive(_policy(name), step, 17), drive(_policy(name), step, 17)
    assert torch.equal(first.pool.token, second.pool.token)
    assert torch.equal(first.pool.cu_nodes, second.pool.cu_nodes)
    assert torch.equal(first.keep, second.keep)


def test_policies_satisfy_the_protocol() -> None:
    for name in POLICY_NAMES:
        assert isinstance(_policy(name), Policy)


def test_chain_drafts_one_greedy_child_per_depth() -> None:
    run = drive(make_policy("chain", SMALL), _steps(5, 3)[0], budget=12)
    tree = select_nodes(run.pool, run.keep)
    for b in range(3):
        depths = tree.request(b).depth
        assert torch.equal(depths, torch.arange(1, depths.numel() + 1))
    assert bool((run.pool.nodes_per_request() <= SMALL.chain_length).all())


def test_uniform_baselines_shrink_to_the_budget_share() -> None:
    step = _steps(6, 4)[0]
    for name in ("chain", "static", "eagle2"):
        run = drive(make_policy(name, SMALL), step, budget=9)  # floor(9 / 4) = 2 per request
        per_request = select_nodes(run.pool, run.keep).nodes_per_request()
        assert bool((per_request <= torch.minimum(step.max_nodes, torch.tensor(2))).all())


def test_eagle2_keeps_the_best_nodes_of_each_request_by_path_score() -> None:
    step = _steps(7, 3)[0]
    run = drive(make_policy("eagle2", SMALL), step, budget=100)
    for b in range(3):
        lo, hi = int(run.pool.cu_nodes[b]), int(run.pool.cu_nodes[b + 1])
        n = min(SMALL.tree_nodes, int(step.max_nodes[b]), hi - lo)
        scores = run.pool.path_logprob[lo:hi]
        kept = run.keep[lo:hi]
        assert int(kept.sum()) == n
        if 0 < n < hi - lo:
            assert float(scores[kept].min()) >= float(scores[~kept].max())


def test_static_tree_follows_the_branching() -> None:
    config = PolicyConfig(static_branching=(2, 2, 1), num_draft_tokens=11)
    step = _steps(8, 2)[0]
    step = step.with_max_nodes(torch.tensor([100, 100]))
    run = drive(make_policy("static", config), step, budget=100)
    assert torch.bincount(run.pool.depth).tolist() == [0, 4, 8, 8]
    assert int(run.keep.sum()) == 20


def test_unknown_policy_and_mislabelled_ablation_are_rejected() -> None:
    with pytest.raises(PolicyError, match="unknown policy 'medusa'; known: plain, chain"):
        make_policy("medusa")
    for gone in ("echo_history", "echo_aging", "echo_slack", "echo_reserve"):
        with pytest.raises(PolicyError, match="unknown policy"):
            make_policy(gone)
    with pytest.raises(PolicyError, match="dense"):
        make_policy("echo_dense", SMALL, gate=GatePolicy.fixed(0.2, 5))


def test_the_registry_names_every_policy_once_and_builds_it_by_name() -> None:
    assert POLICY_NAMES == (
        "plain",
        "chain",
        "static",
        "eagle2",
        "global_topk",
        "echo",
        "echo_dense",
        "echo_fixed",
        "echo_noledger",
        "echo_device",
    )
    assert policy_names() == (*POLICY_NAMES, *FLOORED_NAMES)
    assert "echo_noledger" not in policy_names(engine_offered=True)
    assert set(policy_names(engine_offered=True)) < set(POLICY_NAMES)
    for name in POLICY_NAMES:
        assert _policy(name).name == name
        assert policy_spec(name).summary
    assert policy_spec("echo_dense").gate_mode is GateMode.DENSE
    with pytest.raises(PolicyError, match="already registered"):
        register_policy("echo", lambda cfg, gate: PlainPolicy(), summary="a second echo")


def test_a_registered_policy_is_made_by_name() -> None:
    name = "test_plain_alias"
    spec = register_policy(name, lambda cfg, gate: PlainPolicy(), summary="plain, by another name")
    try:
        assert name in policy_names()
        assert policy_spec(name) is spec
        assert isinstance(make_policy(name), PlainPolicy)
    finally:
        _REGISTRY.pop(name)


def test_step_batch_validates_its_tensors() -> None:
    with pytest.raises(PolicyError, match="max_nodes"):
        StepBatch(batch_size=2, budget=3, max_nodes=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(PolicyError, match="budget"):
        StepBatch.uniform(2, -1)


def test_after_depth_before_begin_step_is_an_error() -> None:
    with pytest.raises(PolicyError, match="begin_step"):
        make_policy("echo").after_depth(empty_tree(1))
