"""Per-request acceptance history (echo_scheduler.history) and ECHO's keys rescaled by it."""

from __future__ import annotations

import pytest
import torch

from echo_gating.maps import AcceptanceMaps, DepthMap
from echo_gating.policy import GateMode, GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.cost import ProfileCost
from echo_scheduler.driver import drive_step
from echo_scheduler.errors import PolicyError
from echo_scheduler.history import RequestHistory
from echo_scheduler.interface import RowPrice, StepBatch, StepOutcome
from echo_scheduler.outcome import accepted_lengths
from echo_scheduler.policies import make_policy
from echo_scheduler.policies.echo import EchoPolicy
from echo_scheduler.simulator import SimSource
from echo_scheduler.workloads import SyntheticStep, SyntheticWorkload


def ids(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def test_factors_are_shrunk_ratios_of_accepted_to_predicted() -> None:
    h = RequestHistory(alpha=0.3, prior=3.0, forget_after=0)  # forget at the first absence
    assert h.factors(ids(7, 8)).tolist() == [1.0, 1.0]  # unseen: f = 1
    h.update(ids(7, 8), ids(3, 0), torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert h.factors(ids(7, 8)).tolist() == pytest.approx([6 / 4, 3 / 5])
    h.update(ids(7), ids(1), torch.tensor([1.0], dtype=torch.float64))
    a, p = 0.7 * 3 + 1, 0.7 * 1 + 1  # decayed sums
    assert float(h.factors(ids(7, 8))[0]) == pytest.approx((a + 3) / (p + 3))
    assert h.factors(ids(8)).tolist() == pytest.approx([3 / 5])  # forgets 7 (absent)
    assert len(h) == 1
    assert h.factors(ids(7)).tolist() == [1.0]


def test_a_short_absence_is_not_a_departure() -> None:
    h = RequestHistory(forget_after=2)
    h.update(ids(1, 2), ids(6, 0), torch.tensor([0.0, 0.0], dtype=torch.float64))
    h.factors(ids(1, 2))
    h.factors(ids(2))  # the engine retried a failed step per request: 1 absent twice
    h.factors(ids(2))
    assert float(h.factors(ids(1, 2))[0]) == pytest.approx(9 / 3)  # still known
    for _ in range(3):
        h.factors(ids(2))
    assert float(h.factors(ids(1, 2))[0]) == 1.0  # absent 3 > 2 calls: forgotten


def test_factors_are_clamped_and_bad_settings_refused() -> None:
    h = RequestHistory(prior=1.0, f_min=0.5, f_max=1.25)
    h.update(ids(1, 2), ids(9, 0), torch.tensor([0.0, 9.0], dtype=torch.float64))
    assert h.factors(ids(1, 2)).tolist() == [1.25, 0.5]
    for bad in (
        {"alpha": 0.0},
        {"prior": 0.0},
        {"f_min": 1.5},
        {"f_max": 0.9},
        {"forget_after": -1},
    ):
        with pytest.raises(PolicyError):
            RequestHistory(**bad)
    with pytest.raises(PolicyError, match="matching"):
        h.update(ids(1, 2), ids(1), torch.zeros(2))


def _gate() -> GatePolicy:
    """Depth 1 is worth 0.2 or 0.9 by score, deeper 0.3 or 0.6."""
    maps = AcceptanceMaps(
        (
            DepthMap(edges=(-1.0,), values=(0.2, 0.9), counts=(10, 10)),
            DepthMap(edges=(-2.0,), values=(0.3, 0.6), counts=(10, 10)),
        )
    )
    return GatePolicy(
        version="t", mode=GateMode.NONE, thresholds={}, acceptance_maps=maps, max_depth=2
    )


def _step() -> SyntheticStep:
    step = SyntheticWorkload.qwen().sample(2, 1, torch.Generator().manual_seed(4))[0]
    return step.with_max_nodes(torch.full((2,), 100))


def _batch(step: SyntheticStep, requests: torch.Tensor | None) -> StepBatch:
    return StepBatch(2, 100, step.max_nodes, min_utility=0.5, requests=requests)


def test_a_request_that_accepted_less_than_predicted_loses_its_rows() -> None:
    step, cfg = _step(), PolicyConfig(max_depth=3, max_width=3)
    plain = EchoPolicy(cfg, _gate())
    base = drive_step(plain, SimSource(step), _batch(step, ids(0, 1)), strict=True)
    held = torch.bincount(base.pool.request_index()[base.keep], minlength=2)
    assert int(held[0]) > 0  # without history, request 0 pays for rows under the floor

    history = RequestHistory()
    history.update(ids(0, 1), ids(0, 6), torch.tensor([5.0, 1.0], dtype=torch.float64))
    # f_0 = 3 / 8: even a 0.9 key becomes 0.34 < the 0.5 floor; f_1 = 9 / 4
    policy = EchoPolicy(cfg, _gate(), history=history)
    run = drive_step(policy, SimSource(step), _batch(step, ids(0, 1)), strict=True)
    req = run.pool.request_index()
    assert int(run.keep[req == 0].sum()) == 0
    key = policy.key(run.pool)
    assert bool((key[req == 1] <= 1.0).all())
    gp = run.pool.global_parent()
    has = gp >= 0
    assert bool((key[has] <= key[gp[has]]).all())  # still non-increasing along paths

    # the step's outcome is folded in with the *unscaled* keys of the verified nodes
    lengths = accepted_lengths(run.pool, run.keep, step.target)
    verified = torch.bincount(req[run.keep], minlength=2)
    unscaled = EchoPolicy(cfg, _gate()).key(run.pool)
    predicted_1 = float(unscaled[run.keep & (req == 1)].sum())
    policy.observe(StepOutcome(accepted_lengths=lengths, verified=verified))
    a = 0.7 * 6 + int(lengths[1])
    p = 0.7 * 1 + predicted_1
    assert float(history.factors(ids(0, 1))[1]) == pytest.approx(min((a + 3) / (p + 3), 4.0))


def test_without_request_serials_the_history_policy_is_echo() -> None:
    step = _step()
    a = make_policy("echo_history", PolicyConfig(max_depth=3, max_width=3), _gate())
    b = make_policy("echo", PolicyConfig(max_depth=3, max_width=3), _gate())
    ra = drive_step(a, SimSource(step), _batch(step, None), strict=True)
    rb = drive_step(b, SimSource(step), _batch(step, None), strict=True)
    assert torch.equal(ra.keep, rb.keep)
    assert torch.equal(ra.pool.token, rb.pool.token)
    with pytest.raises(PolicyError, match="requests"):
        StepBatch(2, 4, step.max_nodes, requests=ids(1))


def test_aging_gives_a_starved_request_its_best_depth_one_node_first() -> None:
    step = SyntheticWorkload.qwen().sample(2, 1, torch.Generator().manual_seed(1))[0]
    step = step.with_max_nodes(torch.full((2,), 100))
    policy = EchoPolicy(PolicyConfig(max_depth=3, max_width=3), _gate(), aging=2)
    held = []
    for _ in range(5):
        run = drive_step(policy, SimSource(step), _batch(step, ids(10, 11)), strict=True)
        req = run.pool.request_index()
        verified = torch.bincount(req[run.keep], minlength=2)
        held.append(verified.tolist())
        lengths = accepted_lengths(run.pool, run.keep, step.target)
        policy.observe(StepOutcome(accepted_lengths=lengths, verified=verified))
        if int(verified[0]) == 1:  # the forced node: request 0's best depth-1 draft
            first = (req == 0) & (run.pool.depth == 1)
            key = policy.key(run.pool)
            assert bool(run.keep[first & (key == key[first].max())].any())
    # under the 0.5 floor request 0 never pays for a row: starved twice, then one node, then
    # (having verified a row) starved twice again
    assert [h[0] for h in held] == [0, 0, 1, 0, 0]
    assert all(h[1] > 0 for h in held)
    with pytest.raises(PolicyError, match="aging"):
        EchoPolicy(PolicyConfig(), aging=-1)


def test_serials_change_nothing_for_plain_echo() -> None:
    step, cfg = _step(), PolicyConfig(max_depth=3, max_width=3)
    named = drive_step(EchoPolicy(cfg, _gate()), SimSource(step), _batch(step, ids(3, 4)))
    anon = drive_step(EchoPolicy(cfg, _gate()), SimSource(step), _batch(step, None))
    assert torch.equal(named.keep, anon.keep)
    assert torch.equal(named.pool.token, anon.pool.token)
    with pytest.raises(PolicyError, match="host"):
        StepBatch(2, 4, step.max_nodes, requests=ids(1, 2).to("meta"))


def test_aging_rows_pass_the_exact_cut_and_are_priced_as_verified() -> None:
    step = SyntheticWorkload.qwen().sample(2, 1, torch.Generator().manual_seed(1))[0]
    step = step.with_max_nodes(torch.full((2,), 100))
    # rows priced at 0.3 tokens each (rate 1 token/s, 0.3 s per row past the roots)
    price = RowPrice(1.0, ProfileCost((0.0, 100.0), (0.0, 30.0)))
    batch = StepBatch(2, 100, step.max_nodes, min_utility=0.5, row_price=price, requests=ids(5, 6))
    policy = EchoPolicy(PolicyConfig(max_depth=3, max_width=3), _gate(), aging=1)
    first = drive_step(policy, SimSource(step), batch, strict=True)
    req = first.pool.request_index()
    verified = torch.bincount(req[first.keep], minlength=2)
    assert int(verified[0]) == 0
    lengths = accepted_lengths(first.pool, first.keep, step.target)
    policy.observe(StepOutcome(accepted_lengths=lengths, verified=verified))
    aged = drive_step(policy, SimSource(step), batch, strict=True)
    req = aged.pool.request_index()
    assert int(aged.keep[req == 0].sum()) == 1  # its best depth-1 node, past floor and cut
    # the cut on the other request is the one it makes with that row already verified
    assert int(aged.keep[req == 1].sum()) >= 1
