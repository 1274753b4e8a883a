"""Fixed baselines offered ECHO's floor (echo_scheduler.policies.floored): the fixed policy's
own tree, ECHO's pre-check and the exact cut over calibrated keys."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_gating.policy import GatePolicy
from echo_gating.testing import stepped_gate
from echo_scheduler.config import PolicyConfig
from echo_scheduler.cost import VerifyCostModel
from echo_scheduler.cut import exact_cut
from echo_scheduler.driver import DrivenStep, drive_step
from echo_scheduler.errors import PolicyError
from echo_scheduler.interface import RowPrice, StepBatch
from echo_scheduler.policies import FLOORED_NAMES, make_policy
from echo_scheduler.ranking import monotone_key
from echo_scheduler.simulator import SimSource
from echo_scheduler.workloads import SyntheticWorkload

CONFIGS = {
    "chain": PolicyConfig(chain_length=3),
    "static": PolicyConfig(static_branching=(2, 1)),
    "eagle2": PolicyConfig(num_draft_tokens=5, base_depth=3, topk=3),
}


def _run(name: str, batch: StepBatch, seed: int) -> DrivenStep:
    step = SyntheticWorkload.qwen().sample(batch.batch_size, 1, torch.Generator().manual_seed(seed))
    cfg = CONFIGS[name.removesuffix("+floor")]
    gate = stepped_gate() if name.endswith("+floor") else None
    policy = make_policy(name, cfg, gate=gate)
    return drive_step(policy, SimSource(step[0]), batch, strict=True)


def _batch(b: int, min_utility: float = 0.0, row_price: RowPrice | None = None) -> StepBatch:
    return StepBatch(b, 4 * b, torch.full((b,), 8), min_utility=min_utility, row_price=row_price)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), b=st.integers(1, 6), base=st.sampled_from(list(CONFIGS)))
def test_without_prices_the_floored_policy_is_the_fixed_one(seed: int, b: int, base: str) -> None:
    plain, floored = _run(base, _batch(b), seed), _run(f"{base}+floor", _batch(b), seed)
    assert plain.depths == floored.depths
    assert torch.equal(plain.pool.token, floored.pool.token)
    assert torch.equal(plain.keep, floored.keep)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    b=st.integers(1, 6),
    base=st.sampled_from(list(CONFIGS)),
    rate=st.floats(10.0, 2000.0),
)
def test_with_a_row_price_the_fixed_selection_is_cut_exactly(
    seed: int, b: int, base: str, rate: float
) -> None:
    """The same tree is drafted; the rows kept are the exact cut of the fixed policy's own
    selection by calibrated keys (ancestor-closed, a subset)."""
    price = RowPrice(rate, VerifyCostModel(0.010, 0.0001, 0.002, 12.0))
    plain = _run(base, _batch(b), seed)
    floored = _run(f"{base}+floor", _batch(b, row_price=price), seed)
    assert torch.equal(plain.pool.token, floored.pool.token)
    maps = stepped_gate().acceptance_maps
    assert maps is not None
    pool = plain.pool
    key = monotone_key(pool, maps.expected_accept(pool.depth, pool.path_logprob))
    assert torch.equal(floored.keep, exact_cut(key, plain.keep, b, price))
    assert not bool((floored.keep & ~plain.keep).any())
    parent = pool.global_parent()
    kept_children = floored.keep & (parent >= 0)
    assert bool(floored.keep[parent[kept_children]].all())  # ancestor-closed


def test_the_pre_check_skips_drafting_when_no_depth_one_row_can_pay() -> None:
    """m_1(0) = 0.9 under the maps: a floor of 0.95 leaves nothing worth drafting."""
    run = _run("chain+floor", _batch(3, min_utility=0.95), 1)
    assert run.depths == 0
    assert run.pool.num_nodes == 0
    drafted = _run("chain+floor", _batch(3, min_utility=0.5), 1)
    assert drafted.depths == 3


def test_a_floored_policy_needs_acceptance_maps() -> None:
    assert FLOORED_NAMES == ("chain+floor", "static+floor", "eagle2+floor")
    with pytest.raises(PolicyError, match="acceptance maps"):
        make_policy("eagle2+floor", CONFIGS["eagle2"], gate=None)
    with pytest.raises(PolicyError, match="acceptance maps"):
        make_policy("chain+floor", CONFIGS["chain"], gate=GatePolicy.none())
    policy = make_policy("static+floor", CONFIGS["static"], gate=stepped_gate())
    assert policy.name == "static+floor"
    assert policy.active_gate() is not None
    assert not policy.set_gate(GatePolicy.none())  # no maps: refused
