"""The draft ledger: realised net value of drafted steps, the plain fallback and its probes."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import pytest
import torch

from echo_scheduler.config import PolicyConfig
from echo_scheduler.driver import drive_step
from echo_scheduler.errors import PolicyError
from echo_scheduler.interface import RowPrice, StepBatch, StepOutcome
from echo_scheduler.ledger import DraftedStep, DraftLedger, Mode, ModeChooser
from echo_scheduler.policies import make_policy
from echo_scheduler.policies.echo import EchoPolicy
from echo_scheduler.simulator import SimSource
from echo_scheduler.workloads import SyntheticWorkload


@dataclass(frozen=True)
class _LinearLatency:
    """t(T) = a + b T seconds."""

    a: float
    b: float

    def latency_at(self, tokens: float) -> float:
        return self.a + self.b * tokens

    def latency(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.a + self.b * tokens.to(torch.float64)


def _step(live: int, accepted: int, verified: int, row: float = 0.5) -> DraftedStep:
    return DraftedStep(
        live=live,
        roots=live,
        accepted=accepted,
        verified=verified,
        expansions=live,
        calls=1,
        row_cost=row * verified,
        node_price=0.1,
        call_price=0.2,
    )


def test_value_is_accepted_minus_every_priced_resource() -> None:
    s = _step(4, accepted=3, verified=4)
    assert s.per_root() == pytest.approx((3 - 0.5 * 4 - 0.1 * 4) / 4)
    assert s.value() == pytest.approx(3 - 0.5 * 4 - 0.1 * 4 - 0.2 * 1)


def test_a_timed_step_charges_its_measured_drafting_instead_of_the_prices() -> None:
    s = replace(_step(4, accepted=3, verified=4), draft_cost=0.9)
    assert s.per_root() == pytest.approx((3 - 0.5 * 4 - 0.9) / 4)
    assert s.priced_calls() == 0
    assert s.value() == pytest.approx(3 - 0.5 * 4 - 0.9)  # no call price on top


def test_timed_steps_add_no_call_price_to_the_gain() -> None:
    ledger = DraftLedger(min_drafted=1, z=0.0)
    ledger.record(replace(_step(8, accepted=6, verified=8), draft_cost=1.0))
    v = (6 - 0.5 * 8 - 1.0) / 8
    assert ledger.gain(8, call_price=5.0) == pytest.approx(8 * v)  # C = 0: the price is unused
    priced = DraftLedger(min_drafted=1, z=0.0)
    priced.record(_step(8, accepted=6, verified=8))
    v = (6 - 0.5 * 8 - 0.1 * 8) / 8
    assert priced.gain(8, call_price=5.0) == pytest.approx(8 * v - 1 * 5.0)


def test_echo_charges_the_timed_draft_phase_at_the_run_rate() -> None:
    """ECHO's ledger records ``R_run d`` tokens for a step whose draft phase took d seconds."""
    policy = make_policy("echo", PolicyConfig(max_depth=3, max_width=2))
    assert isinstance(policy, EchoPolicy)
    assert policy.ledger is not None
    work = SyntheticWorkload.llama().sample(4, 1, torch.Generator().manual_seed(3))
    st = work[0].with_max_nodes(torch.full((4,), 1000))
    price = RowPrice(rate=50.0, latency=_LinearLatency(0.01, 0.002))
    # an undrafted step first (every request at its cap): its 4 ms of draft phase is the
    # set-up every step pays, d_0
    capped = torch.zeros(4, dtype=torch.int64)
    full = StepBatch(4, 16, capped, min_utility=0.01, depth_price=0.01, row_price=price)
    assert drive_step(policy, SimSource(st.with_max_nodes(capped)), full, strict=True).depths == 0
    none = torch.zeros(4, dtype=torch.int64)
    policy.observe(StepOutcome(none, none, draft_s=0.004))
    assert policy.ledger.summary() == {}
    batch = StepBatch(4, 16, st.max_nodes, min_utility=0.01, depth_price=0.01, row_price=price)
    run = drive_step(policy, SimSource(st), batch, strict=True)
    assert run.depths > 0
    verified = torch.bincount(run.pool.request_index()[run.keep], minlength=4)
    n = int(verified.sum())
    policy.observe(StepOutcome(none, verified, draft_s=0.02))
    bucket = policy.ledger.summary()[DraftLedger.bucket(4)]
    # v = (A - c_rows - R_run (d - d_0)) / roots, with c_rows = R_run (t(B + N) - t(B))
    expected = (0 - 50.0 * 0.002 * n - 50.0 * (0.02 - 0.004)) / 4
    assert bucket["per_root"] == pytest.approx(expected)
    assert bucket["calls"] == 0.0  # timed: no call is priced on top


def test_a_bad_draft_time_is_refused() -> None:
    with pytest.raises(PolicyError, match="draft_s"):
        StepOutcome(torch.zeros(1, dtype=torch.int64), torch.zeros(1).long(), draft_s=-1.0)
    with pytest.raises(PolicyError, match="draft_s"):
        StepOutcome(torch.zeros(1, dtype=torch.int64), torch.zeros(1).long(), float("nan"))
    with pytest.raises(PolicyError, match="draft_cost"):
        DraftLedger().record(replace(_step(4, 1, 1), draft_cost=float("inf")))


def test_drafting_goes_on_until_enough_steps_show_a_loss() -> None:
    ledger = DraftLedger(min_drafted=3)
    for _ in range(2):
        ledger.record(_step(16, accepted=1, verified=8))  # each loses about 4 tokens
        assert ledger.gain(16, 0.2) is None
        assert ledger.should_draft(16, 0.2)
    ledger.record(_step(16, accepted=1, verified=8))
    gain = ledger.gain(16, 0.2)
    assert gain is not None
    assert gain < 0  # no spread: the bound is the mean
    assert not ledger.should_draft(16, 0.2)


def test_a_losing_bucket_probes_with_a_doubling_period_and_recovers() -> None:
    ledger = DraftLedger(min_drafted=1, probe_min=2, probe_max=8)
    ledger.record(_step(16, accepted=0, verified=8))
    pattern = []
    for _ in range(30):
        draft = ledger.should_draft(16, 0.2)
        pattern.append(draft)
        if draft:
            ledger.record(_step(16, accepted=0, verified=8))
    probes = [i for i, d in enumerate(pattern) if d]
    gaps = [b - a - 1 for a, b in itertools.pairwise(probes)]
    assert probes[0] == 2  # two plain steps, then the first probe
    assert gaps[:3] == [4, 8, 8]  # doubling, capped at probe_max
    for _ in range(40):  # the drafter got good: probes see it and drafting resumes
        if ledger.should_draft(16, 0.2):
            ledger.record(_step(16, accepted=16, verified=16))
    assert ledger.should_draft(16, 0.2)
    gain = ledger.gain(16, 0.2)
    assert gain is not None
    assert gain > 0


def test_loads_are_learned_apart() -> None:
    ledger = DraftLedger(min_drafted=1)
    ledger.record(_step(16, accepted=0, verified=8))
    assert not ledger.should_draft(16, 0.2)
    assert not ledger.should_draft(22, 0.2)  # same bucket
    assert not ledger.should_draft(12, 0.2)
    assert ledger.should_draft(23, 0.2)  # the next bucket up: its own, empty record
    assert ledger.should_draft(1, 0.2)  # batch 1 has its own, empty record
    assert ledger.should_draft(4, 0.2)
    assert not ledger.should_draft(0, 0.2)


def test_load_buckets_are_centred_on_powers_of_two() -> None:
    lives = (0, 1, 2, 3, 5, 6, 7, 8, 11, 12, 16, 22, 23, 32, 45, 46)
    expected = [0, 0, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 5, 5, 5, 6]
    assert [DraftLedger.bucket(n) for n in lives] == expected
    for n in range(1, 5000):  # round(log2 n), computed exactly (no tie: log2 n is never k + 1/2)
        assert DraftLedger.bucket(n) == round(math.log2(n))


def test_a_noisy_record_keeps_drafting_until_the_bound_is_negative() -> None:
    ledger = DraftLedger(min_drafted=3, z=1.0)
    for accepted in (0, 4, 0, 4):  # batch 1: mean value 2 - 2 = 0 minus prices, but wide
        ledger.record(_step(1, accepted=accepted, verified=4))
    assert ledger.should_draft(1, 0.2)
    strict = DraftLedger(min_drafted=3, z=0.0)
    for accepted in (0, 4, 0, 4):
        strict.record(_step(1, accepted=accepted, verified=4))
    assert not strict.should_draft(1, 0.2)


def test_bad_settings_and_records_are_refused() -> None:
    with pytest.raises(PolicyError, match="alpha"):
        DraftLedger(alpha=0.0)
    with pytest.raises(PolicyError, match="probe_min"):
        DraftLedger(probe_min=8, probe_max=4)
    with pytest.raises(PolicyError, match="drafted steps"):
        DraftLedger().record(DraftedStep(4, 0, 0, 0, 0, 0, 0.5, 0.1, 0.2))


def _losing_run(policy: EchoPolicy, steps: int) -> list[int]:
    """Drive ``policy`` under a steep floor and report zero acceptances: drafter calls per step."""
    work = SyntheticWorkload.llama().sample(8, steps, torch.Generator().manual_seed(7))
    calls = []
    for st in (w.with_max_nodes(torch.full((8,), 1000)) for w in work):  # 8 live: one bucket
        batch = StepBatch(8, 64, st.max_nodes, min_utility=0.05, depth_price=0.5, node_price=0.3)
        run = drive_step(policy, SimSource(st), batch, strict=True)
        verified = torch.bincount(run.pool.request_index()[run.keep], minlength=8)
        policy.observe(StepOutcome(torch.zeros(8, dtype=torch.int64), verified))
        calls.append(run.depths)
    return calls


def test_echo_falls_back_to_plain_decoding_when_drafting_keeps_losing() -> None:
    cfg = PolicyConfig(max_depth=4, max_width=3)
    learning = make_policy("echo", cfg)
    assert isinstance(learning, EchoPolicy)
    assert learning.ledger is not None
    calls = _losing_run(learning, 16)
    assert all(c > 1 for c in calls[:3])  # min_drafted steps are drafted in full
    assert calls[3:6] == [1, 1, 1]  # then depth 1 only, until its own ledger has judged
    assert calls[6] == 0  # then plain decoding ...
    assert 0 < sum(c > 0 for c in calls[6:]) < 10  # ... with probes
    modes = learning.step_modes  # how each step was decided, as the bench reports it
    assert sum(modes.values()) == len(calls)
    assert modes["floor"] == 0  # the pre-check passes: a depth-1 draft could pay here
    assert modes["plain"] == calls.count(0)
    assert modes["shallow"] >= 3
    assert modes["full"] >= 3
    assert learning.shallow_ledger is not None
    assert learning.shallow_ledger.summary() != {}
    blind = make_policy("echo_noledger", cfg)
    assert isinstance(blind, EchoPolicy)
    assert blind.ledger is None
    assert all(c > 0 for c in _losing_run(blind, 12))


def test_echo_drafts_depth_one_only_while_that_pays_and_full_drafting_does_not() -> None:
    """Full drafting reported as losing, depth-1 steps as paying: ECHO stays on depth 1, and
    its full-drafting probes come back on their doubling clock."""
    policy = make_policy("echo", PolicyConfig(max_depth=4, max_width=3))
    assert isinstance(policy, EchoPolicy)
    work = SyntheticWorkload.llama().sample(8, 24, torch.Generator().manual_seed(7))
    calls = []
    for st in (w.with_max_nodes(torch.full((8,), 1000)) for w in work):
        batch = StepBatch(8, 64, st.max_nodes, min_utility=0.05, depth_price=0.5, node_price=0.3)
        run = drive_step(policy, SimSource(st), batch, strict=True)
        verified = torch.bincount(run.pool.request_index()[run.keep], minlength=8)
        shallow = run.depths == 1
        accepted = verified.clamp(max=1) if shallow else torch.zeros(8, dtype=torch.int64)
        policy.observe(StepOutcome(accepted, verified))
        calls.append(run.depths)
    assert all(c > 1 for c in calls[:3])
    later = calls[3:]
    assert 0 not in later  # never plain: depth 1 pays
    assert later.count(1) > len(later) // 2  # mostly depth 1 ...
    assert any(c > 1 for c in later)  # ... with probes of full drafting


def test_an_unpriced_step_never_consults_the_ledger() -> None:
    policy = EchoPolicy(PolicyConfig(max_depth=3, max_width=2))
    work = SyntheticWorkload.llama().sample(4, 6, torch.Generator().manual_seed(1))
    for st in work:
        run = drive_step(policy, SimSource(st), StepBatch(4, 16, st.max_nodes), strict=True)
        policy.observe(StepOutcome(torch.zeros(4, dtype=torch.int64), torch.zeros(4).long()))
        assert run.depths > 0
    assert policy.ledger is not None
    assert policy.ledger.summary() == {}
    assert sum(policy.step_modes.values()) == 0


def _fed(values: dict[str, float], live: int = 8) -> tuple[DraftLedger, DraftLedger]:
    """Two ledgers that saw ``min_drafted`` steps of per-root value ``values[mode]`` each."""
    full, shallow = DraftLedger(), DraftLedger()
    for ledger, v in ((full, values["full"]), (shallow, values["shallow"])):
        for _ in range(ledger.min_drafted):
            ledger.record(replace(_step(live, 0, 0), row_cost=-v * live, node_price=0.0))
    return full, shallow


def test_the_chooser_measures_both_modes_before_it_compares_them() -> None:
    chooser = ModeChooser(DraftLedger(), DraftLedger())
    picks = []
    for _ in range(6):
        mode = chooser.choose(8, 0.2)
        picks.append(mode)
        ledger = chooser.full if mode == "full" else chooser.shallow
        ledger.record(replace(_step(8, 4, 8), calls=0))
    assert picks == ["full"] * 3 + ["shallow"] * 3
    assert chooser.choose(0, 0.2) == "plain"


def test_where_full_drafting_clearly_pays_depth_one_is_measured_on_its_probe_clock() -> None:
    full, _ = _fed({"full": 0.3, "shallow": 0.0})  # 0.3 per root, no spread: clearly paying
    chooser = ModeChooser(full, DraftLedger())
    picks = []
    for _ in range(40):
        mode = chooser.choose(8, 0.0)
        picks.append(mode)
        if mode == "shallow":  # depth 1 pays more once measured
            chooser.shallow.record(replace(_step(8, 0, 0), row_cost=-0.5 * 8, node_price=0.0))
    probes = [i for i, m in enumerate(picks) if m == "shallow"]
    assert probes[:3] == [4, 13, 30]  # three probes measure it ...
    assert picks[31:36] == ["shallow"] * 4 + ["full"]  # ... then it wins, full probed after 4


@pytest.mark.parametrize(("winner", "loser"), [("shallow", "full"), ("full", "shallow")])
def test_the_mode_that_gains_more_wins_and_the_other_is_probed_ever_more_rarely(
    winner: Mode, loser: Mode
) -> None:
    # per-root values 0.3 against 0.1: both pay, one pays more
    full, shallow = _fed({winner: 0.3, loser: 0.1})
    chooser = ModeChooser(full, shallow)
    picks = [chooser.choose(8, 0.0) for _ in range(100)]
    probes = [i for i, m in enumerate(picks) if m == loser]
    assert "plain" not in picks
    # the loser's clock: probed after 4, 8, 16, 32, 64 skipped steps (probe_max 64)
    assert probes == [4, 13, 30, 63]
    assert picks.count(winner) == 100 - len(probes)


def test_when_both_modes_lose_the_chooser_decodes_plainly_with_probes() -> None:
    full, shallow = _fed({"full": -0.3, "shallow": -0.1})
    chooser = ModeChooser(full, shallow)
    picks = [chooser.choose(8, 0.0) for _ in range(40)]
    assert picks.count("plain") > 30
    assert {"full", "shallow"} <= set(picks)  # each ledger probes on its own clock


def test_a_mode_that_led_lately_is_probed_soon_after_it_falls_behind() -> None:
    full, shallow = _fed({"full": 0.1, "shallow": 0.3})
    chooser = ModeChooser(full, shallow)
    picks = [chooser.choose(8, 0.0) for _ in range(14)]
    assert [i for i, m in enumerate(picks) if m == "full"] == [4, 13]  # period now 16
    for v in (0.9, 0.9):  # full drafting's mean crosses above depth 1's ...
        full.record(replace(_step(8, 0, 0), row_cost=-v * 8, node_price=0.0))
    assert chooser.choose(8, 0.0) == "full"
    for v in (-0.5, -0.5):  # ... and falls back below it
        full.record(replace(_step(8, 0, 0), row_cost=-v * 8, node_price=0.0))
    picks = [chooser.choose(8, 0.0) for _ in range(20)]
    assert [i for i, m in enumerate(picks) if m == "full"] == [4, 13]  # its clock restarted


def test_the_chooser_compares_mean_gains_not_the_noisier_modes_upper_bound() -> None:
    _, shallow = _fed({"full": 0.0, "shallow": 0.25})
    full = DraftLedger()
    for v in (-0.2, 0.6, -0.2, 0.6):  # plain means over 4 steps: 0.2, standard error 0.2
        full.record(replace(_step(8, 0, 0), row_cost=-v * 8, node_price=0.0))
    bound, mean = full.gain(8, 0.0), full.gain(8, 0.0, z=0.0)
    assert bound is not None
    assert mean is not None
    assert bound > 8 * 0.25 > mean  # full's bound beats depth 1, its mean does not
    assert ModeChooser(full, shallow).choose(8, 0.0) == "shallow"


def test_the_chooser_says_which_drafted_steps_only_explore() -> None:
    """``exploring``: the first ``min_drafted`` steps of each mode, and probes while both lose;
    a mode chosen because it pays is not exploring, nor is a plain step."""
    chooser = ModeChooser(DraftLedger(), DraftLedger())
    for _ in range(6):  # both modes measured first
        mode = chooser.choose(8, 0.2)
        assert mode != "plain"
        assert chooser.exploring
        ledger = chooser.full if mode == "full" else chooser.shallow
        ledger.record(replace(_step(8, 0, 8, row=1.0), calls=0))  # every step loses
    seen = []
    for _ in range(40):
        mode = chooser.choose(8, 0.0)
        seen.append((mode, chooser.exploring))
    assert {e for m, e in seen if m == "plain"} == {False}
    assert {e for m, e in seen if m != "plain"} == {True}  # each drafted step is a probe
    assert any(m != "plain" for m, _ in seen)
    paying, _ = _fed({"full": 0.3, "shallow": 0.0})  # full clearly pays, depth 1 unmeasured
    chooser = ModeChooser(paying, DraftLedger())
    picks = [(chooser.choose(8, 0.0), chooser.exploring) for _ in range(10)]
    assert ("full", False) in picks
    assert {e for m, e in picks if m == "shallow"} == {True}  # depth 1's probe clock
