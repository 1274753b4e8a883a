"""Checked verify profiles on an injected clock (engine/profile_store.py) and the engine's live
correction of the floor and K from them (engine/cost_feedback.py). Nothing here is timed: the
timer is a function of the row count and the call number."""

from __future__ import annotations

import importlib
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from structlog.testing import capture_logs

from echo_core.sampling import SamplingParams
from echo_gating.testing import stepped_gate
from echo_scheduler.budget import BudgetChain, LocalBudget
from echo_scheduler.cost import ProfileCost, VerifyCostModel
from echo_scheduler.elastic import ElasticFloor
from echo_scheduler.live_cost import MIN_SAMPLES, SWAP_TOLERANCE
from echo_scheduler.policies import make_policy
from echo_scheduler.policies.echo import EXPLORE_AFTER, EchoPolicy
from echo_scheduler.profile_check import ProfileRounds, check_profile
from echo_server.drafting import NgramDrafter
from echo_server.engine import Engine, EngineConfig, GenerationRequest, cost_feedback, profile_store
from echo_server.engine.cost_feedback import (
    EXPLORE_SPAN,
    CostFeedback,
    samples_of,
)
from echo_server.engine.pass_timing import PendingTimings, start_events, stop_events
from echo_server.engine.profile_store import (
    FORMAT,
    CheckedProfile,
    ProfileSource,
    Timer,
    load_or_measure_checked,
    measure_checked,
    save,
)
from echo_server.engine.report import StepReport, VerifiedStep
from echo_server.model import load_model_only
from echo_server.model.loader import LoadedModel

TOKENS = (1, 2, 3, 4, 6, 7, 8, 12, 16)
IDENTITY = {"cpu": "Test CPU", "torch": "2.x", "threads": "1", "model": "m", "device": "cpu"}


def curve_ms(t: int) -> float:
    """A quiet machine's cost: flat for 1-6 rows, a step at 7, then 1 ms per row."""
    return 30.0 + 0.3 * min(t, 6) + (6.0 if t >= 7 else 0.0) + max(t - 8, 0) * 1.0


class FakeClock:
    """Seconds of a verify pass over T rows: ``curve_ms(T)`` times ``noise(call number)``."""

    def __init__(self, noise: Callable[[int], float] = lambda n: 1.0) -> None:
        self.noise, self.calls = noise, 0

    def __call__(self, t: int) -> float:
        self.calls += 1
        return curve_ms(t) / 1e3 * self.noise(self.calls)


def jitter(n: int) -> float:
    """Rounds disagreeing by +-40%: the machine busy with other work."""
    return (1.4, 0.6, 1.0)[n % 3]


def never(_: int) -> float:
    raise AssertionError("measured although the cached profile should have been used")


def no_timer() -> Timer:
    return never


def measure(
    path: Path | None, clock: FakeClock, identity: dict[str, str] = IDENTITY
) -> CheckedProfile:
    return load_or_measure_checked(path, identity, lambda: clock, TOKENS, rounds=5)


def test_a_quiet_measurement_is_fresh_and_cached_with_its_raw_rounds(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    checked = measure(path, FakeClock())
    assert checked.source is ProfileSource.FRESH
    assert checked.attempts == 1
    assert checked.profile.latency_at(7) == pytest.approx(curve_ms(7) / 1e3)
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT
    assert data["machine"] == IDENTITY
    assert len(data["rounds"]) == len(TOKENS)
    assert all(len(r) == 5 for r in data["rounds"])


def test_a_noisy_measurement_is_rejected_and_measured_again() -> None:
    calls = {"n": 0}

    def first_attempt_noisy(n: int) -> float:
        calls["n"] = n
        return jitter(n) if n <= len(TOKENS) * 6 + 10 else 1.0  # noisy through attempt 1

    with capture_logs() as logs:
        checked = measure_checked(FakeClock(first_attempt_noisy), TOKENS, rounds=5)
    assert checked.source is ProfileSource.FRESH
    assert checked.attempts == 2
    rejected = [e for e in logs if e["event"] == "verify_profile_rejected"]
    assert len(rejected) == 1
    assert "rounds disagree" in rejected[0]["reasons"][0]


def test_a_cached_good_profile_is_kept_without_measuring(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    measure(path, FakeClock())
    checked = load_or_measure_checked(path, IDENTITY, no_timer, TOKENS)
    assert checked.source is ProfileSource.CACHED
    assert checked.attempts == 0
    assert checked.profile.latency_at(12) == pytest.approx(curve_ms(12) / 1e3)


def plant(path: Path, ms: dict[int, float], identity: dict[str, str] = IDENTITY) -> None:
    """A cache file of ``ms`` whose rounds agree exactly and whose reference did not drift."""
    tokens = sorted(ms)
    data = {
        "format": FORMAT,
        "machine": identity,
        "tokens": tokens,
        "seconds": [ms[t] / 1e3 for t in tokens],
        "rounds": [[ms[t] / 1e3] * 5 for t in tokens],
        "reference_s": [ms[tokens[0]] / 1e3] * 2,
    }
    path.write_text(json.dumps(data))


def test_the_profile_cached_under_load_is_rejected_on_load_and_measured_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "k.json"
    # the AMD EPYC VM's profile of 2026-12-05, taken while other work ran
    plant(path, {1: 33.8, 2: 49.2, 3: 44.4, 4: 32.9, 7: 56.3, 8: 37.2})
    clock = FakeClock()
    with capture_logs() as logs:
        checked = measure(path, clock)
    assert clock.calls > 0
    assert checked.source is ProfileSource.FRESH
    (rejected,) = [e for e in logs if e["event"] == "verify_profile_cache_rejected"]
    assert rejected["reason"] == "check"
    assert "not monotone" in rejected["failed"][0]
    assert json.loads(path.read_text())["tokens"] == list(TOKENS)  # replaced by the new one


@pytest.mark.parametrize("stale", ["machine", "format"])
def test_another_machine_or_format_is_measured_again(tmp_path: Path, stale: str) -> None:
    path = tmp_path / "k.json"
    if stale == "machine":
        plant(path, {t: curve_ms(t) for t in TOKENS}, {**IDENTITY, "torch": "2.y"})
    else:  # the medians-only file written before 2026-12-05
        path.write_text(json.dumps({"tokens": list(TOKENS), "seconds": [0.03] * len(TOKENS)}))
    clock = FakeClock()
    with capture_logs() as logs:
        checked = measure(path, clock)
    assert checked.source is ProfileSource.FRESH
    assert clock.calls > 0
    assert [e["reason"] for e in logs if e["event"] == "verify_profile_cache_rejected"] == [stale]


def test_a_profile_that_never_settles_is_used_but_not_cached(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    with capture_logs() as logs:
        checked = measure(path, FakeClock(jitter))
    assert checked.source is ProfileSource.UNSETTLED
    assert checked.attempts == 3
    assert not path.exists()
    (event,) = [e for e in logs if e["event"] == "verify_profile_unsettled"]
    assert event["cached"] is False
    assert event["reasons"]
    ys = checked.profile.seconds  # the monotone envelope of every attempt's rounds pooled
    assert all(b >= a for a, b in itertools.pairwise(ys))
    assert len(checked.rounds.rounds[0]) == 15
    with pytest.raises(ValueError, match="only a fresh"):
        save(path, IDENTITY, checked)


def bad_profile() -> ProfileCost:
    ms = {1: 33.8, 2: 49.2, 3: 44.4, 4: 32.9, 7: 56.3, 8: 37.2, 16: 60.0, 32: 90.0}
    return ProfileCost(tuple(map(float, ms)), tuple(v / 1e3 for v in ms.values()))


def test_the_floor_and_k_follow_the_live_curve_once_enough_samples_exist() -> None:
    profile = bad_profile()
    floor = ElasticFloor(profile)
    hinge = VerifyCostModel.fit(list(profile.tokens), list(profile.seconds))
    budget = BudgetChain(LocalBudget(cost=hinge))
    ceiling = 12
    checked = cast(CheckedProfile, SimpleNamespace(profile=profile, source=ProfileSource.CACHED))
    feedback = CostFeedback(checked, floor, budget, ceiling)
    before_k, before_u = budget.k(1), floor.floor(1).min_utility
    rows = (1, 2, 3, 4, 6, 7, 8, 16, 32)
    for _step in range(MIN_SAMPLES - 1):
        for t in rows:
            assert feedback.take([(t, curve_ms(t) / 1e3)]) is None  # not yet ready
            assert floor.cost is profile
    assert budget.k(1) == before_k
    swapped = [feedback.take([(t, curve_ms(t) / 1e3)]) for t in rows]
    assert any(c is not None for c in swapped)
    assert floor.cost is feedback.live.curve
    assert floor.cost.latency_at(2) == pytest.approx(curve_ms(2) / 1e3)
    assert floor.floor(1).min_utility < before_u
    assert budget.local.cost is not hinge  # refitted to the corrected curve
    assert budget.k(1) <= ceiling  # never past the KV slack admission reserved
    assert feedback.snapshot.source == "cached"
    assert feedback.snapshot.swaps >= 1
    live = {b.rows: b.live_s for b in feedback.snapshot.buckets}
    assert live[7] == pytest.approx(curve_ms(7) / 1e3)


def test_exploration_names_the_first_untimed_row_count_above_the_batch() -> None:
    profile = bad_profile()
    floor = ElasticFloor(profile)
    checked = cast(CheckedProfile, SimpleNamespace(profile=profile, source=ProfileSource.CACHED))
    feedback = CostFeedback(checked, floor, BudgetChain(LocalBudget(fixed=8), floor), None)
    assert feedback.explore_rows([2]) == 1  # rows 3, 4, 5 untimed: B + 1 first
    assert feedback.explore_rows([]) == 0  # a step without a decode pass asks for nothing
    for t in (3, 4):
        for _ in range(MIN_SAMPLES):
            feedback.take([(t, curve_ms(t) / 1e3)])
    assert feedback.explore_rows([2]) == 3  # B + 1 and B + 2 timed: B + 3 next
    for _ in range(MIN_SAMPLES):
        feedback.take([(2 + EXPLORE_SPAN, curve_ms(2 + EXPLORE_SPAN) / 1e3)])
    assert feedback.explore_rows([2]) == 0  # all timed
    assert feedback.explore_rows([1]) == 1  # another batch size: its own row counts
    feedback.explores = False
    assert feedback.explore_rows([1]) == 0


def test_samples_come_from_timed_passes_only() -> None:
    def verified(b: int, n: int, forward: float | None) -> object:
        tree = SimpleNamespace(num_nodes=n)
        return SimpleNamespace(request_ids=("r",) * b, tree=tree, forward_s=forward)

    report = cast(StepReport, SimpleNamespace(passes=(verified(2, 5, 0.03), verified(1, 0, None))))
    assert samples_of(report) == [(7, 0.03)]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A seeded random two-layer Llama saved as a HF checkpoint and loaded by our loader."""
    transformers: Any = importlib.import_module("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    path: Path = tmp_path_factory.mktemp("tiny-llama")
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return load_model_only(path, dtype=torch.float32, device=torch.device("cpu"))


def test_the_engine_corrects_a_wrong_start_up_profile_from_its_own_steps(
    tiny_llama: Any, smollm: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The planted profile prices a pass at 33.8-90 ms; the tiny model's passes take about 1 ms.
    profile = bad_profile()
    rounds = ProfileRounds(
        tuple(int(t) for t in profile.tokens), tuple((s,) for s in profile.seconds), (1.0, 1.0)
    )
    planted = CheckedProfile(
        profile, ProfileSource.CACHED, rounds, check_profile(rounds), attempts=0
    )
    monkeypatch.setattr(profile_store, "checked_profile", lambda *_: planted)
    monkeypatch.setattr(profile_store, "peek", lambda *_: planted)
    monkeypatch.setattr(cost_feedback, "peek", lambda *_: planted)
    engine = Engine(
        tiny_llama,
        smollm.tokenizer,
        make_policy("echo"),
        NgramDrafter(),
        EngineConfig(budget="auto", max_batch=1, kv_slots=4096, elastic=True),
    )
    assert engine.elastic is not None
    assert engine.elastic.cost is profile
    params = SamplingParams(temperature=0.0, max_tokens=3 * MIN_SAMPLES, ignore_eos=True)
    engine.submit(GenerationRequest("r", prompt_ids=tuple(range(10, 20)) * 3, params=params))
    reports = [engine.step() for _ in range(2 * MIN_SAMPLES + 1) if engine.has_work()]
    last = reports[-1].cost
    assert last is not None
    assert last.source == "cached"
    assert last.swaps >= 1  # corrected within the steps one row count needs to be ready
    assert engine.elastic.cost is engine.cost_feedback.live.curve
    curve, live = engine.elastic.cost, engine.cost_feedback.live.ready()
    assert live
    # the curve holds each median as of the last swap (its anchor a; the curve itself for a
    # bucket ready since), lifted only where the envelope must, so c >= a; without a swap since,
    # each median m moved by at most the swap tolerance, m <= (1 + tol) a: c / m >= 1/(1+tol).
    # The envelope may lift a bucket far above its median (the planted profile is not
    # monotone), so the upper side is only that the curve is nearer than the profile anywhere.
    ratios = [curve.latency_at(t) / m for t, m in live.items()]
    profile_ratios = [profile.latency_at(t) / m for t, m in live.items()]
    assert min(ratios) >= 1 / (1 + SWAP_TOLERANCE)
    assert max(profile_ratios) > 1 + SWAP_TOLERANCE
    assert max(ratios) < min(profile_ratios)
    assert engine.budget.local.cost is not None
    ceiling = engine.cost_feedback.k_ceiling
    assert ceiling is not None
    assert engine.budget.k(1) <= ceiling  # never past the KV slack admission reserved


@pytest.mark.parametrize("cached", [True, False])
def test_the_engine_caches_its_profile_where_its_config_says_or_nowhere(
    tiny_llama: Any,
    smollm: LoadedModel,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    cached: bool,
) -> None:
    monkeypatch.setattr(profile_store, "model_timer", lambda *_: FakeClock())
    profile_store.forget()
    cache_dir = tmp_path / "profiles" if cached else None
    engine = Engine(
        tiny_llama,
        smollm.tokenizer,
        make_policy("echo"),
        NgramDrafter(),
        EngineConfig(budget="auto", max_batch=1, elastic=True, profile_cache=cache_dir),
    )
    profile_store.forget()
    assert engine.cost_feedback.checked is not None
    assert engine.cost_feedback.checked.source is ProfileSource.FRESH
    files = sorted((tmp_path / "profiles").glob("*.json")) if cached else []
    assert files == ([profile_store.cache_path(tiny_llama, cache_dir)] if cached else [])
    assert not (tmp_path / "profiles").exists() or cached


def test_exploration_corrects_a_profile_so_dear_that_no_row_ever_pays(
    tiny_llama: Any, smollm: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 5 ms a draft row on top of a pass (the tiny model's passes take about 1 ms, its rows
    # next to nothing): scaled to the one-row passes it still prices every row out
    tokens = (1, 2, 3, 4, 8, 16)
    seconds = tuple(1e-3 + 5e-3 * (t - 1) for t in tokens)
    profile = ProfileCost(tuple(map(float, tokens)), seconds)
    rounds = ProfileRounds(tokens, tuple((s,) for s in seconds), (1e-3, 1e-3))
    planted = CheckedProfile(profile, ProfileSource.CACHED, rounds, check_profile(rounds), 0)
    monkeypatch.setattr(profile_store, "checked_profile", lambda *_: planted)
    monkeypatch.setattr(cost_feedback, "peek", lambda *_: planted)
    policy = make_policy("echo", gate=stepped_gate())
    engine = Engine(
        tiny_llama,
        smollm.tokenizer,
        policy,
        NgramDrafter(),
        EngineConfig(budget=8, max_batch=1, kv_slots=4096, elastic=True),
    )
    # one exploration after every EXPLORE_AFTER refusals; the first few find no n-gram to draft
    steps = (EXPLORE_AFTER + 1) * (MIN_SAMPLES + 6)
    params = SamplingParams(temperature=0.0, max_tokens=4 * steps, ignore_eos=True)
    engine.submit(GenerationRequest("r", prompt_ids=tuple(range(10, 20)) * 3, params=params))
    for _ in range(steps):
        engine.step()
    modes = cast(EchoPolicy, policy).step_modes
    assert modes["explore"] >= MIN_SAMPLES
    live = engine.cost_feedback.live.ready()
    assert 2 in live  # one root and one draft row: timed
    assert engine.cost_feedback.live.swaps >= 1
    assert engine.elastic is not None
    assert engine.elastic.cost.latency_at(2) < profile.latency_at(2) / 2  # the row's price fell


class FakeStream:
    """A device stream on an injected clock: events recorded on it complete, in order, only when
    the test advances it (``run_until``); nothing here can wait for the device."""

    def __init__(self) -> None:
        self.recorded = 0  # events recorded so far
        self.completed = 0  # events the device has passed
        self.now_ms = 0.0

    def run_until(self, index: int, now_ms: float) -> None:
        self.completed, self.now_ms = index, now_ms


class FakeEvent:
    """``torch.cuda.Event``'s timing surface on a :class:`FakeStream`."""

    def __init__(self, stream: FakeStream, at_ms: float) -> None:
        self.stream, self.at_ms, self.index = stream, at_ms, 0

    def record(self) -> None:
        self.stream.recorded += 1
        self.index = self.stream.recorded

    def query(self) -> bool:
        return self.stream.completed >= self.index

    def elapsed_time(self, end_event: Any) -> float:
        assert self.query(), "read before the device passed the start event"
        assert end_event.query(), "read before the device passed the end event"
        return float(end_event.at_ms - self.at_ms)


def recorded_pair(stream: FakeStream, start_ms: float, forward_ms: float) -> Any:
    pair = (FakeEvent(stream, start_ms), FakeEvent(stream, start_ms + forward_ms))
    pair[0].record()
    pair[1].record()
    return pair


def test_event_pairs_are_read_oldest_first_once_complete_and_never_waited_for() -> None:
    stream = FakeStream()
    pending = PendingTimings()
    pending.add(5, recorded_pair(stream, 0.0, 30.0))
    pending.add(9, recorded_pair(stream, 40.0, 45.0))
    assert pending.ready() == []  # queued, not run: nothing read, nothing lost
    stream.run_until(3, 80.0)  # the first pair and the second's start
    [(rows, seconds)] = pending.ready()
    assert rows == 5
    assert seconds == pytest.approx(0.030)
    assert len(pending.queue) == 1
    stream.run_until(4, 90.0)
    [(rows, seconds)] = pending.ready()
    assert rows == 9
    assert seconds == pytest.approx(0.045)
    assert pending.ready() == []


def test_pairs_that_never_complete_are_dropped_oldest_first_past_the_limit() -> None:
    stream = FakeStream()
    pending = PendingTimings(limit=2)
    with capture_logs() as logs:
        for rows in (3, 4, 5):
            pending.add(rows, recorded_pair(stream, 0.0, 1.0))
    assert [rows for rows, _ in pending.queue] == [4, 5]
    assert pending.dropped == 1
    assert [e["event"] for e in logs] == ["verify_events_never_complete"]
    with pytest.raises(ValueError, match="limit"):
        PendingTimings(limit=0)


def test_start_events_off_cuda_is_none() -> None:
    assert start_events(torch.device("cpu")) is None
    assert stop_events(None) is None


def test_cuda_passes_feed_the_live_curve_from_their_events() -> None:
    # A CUDA pass has no wall time (forward_s None) but its event pair: the sample is the
    # device time between them, taken the step the device has passed them.
    profile = bad_profile()
    floor = ElasticFloor(profile)
    checked = cast(CheckedProfile, SimpleNamespace(profile=profile, source=ProfileSource.CACHED))
    feedback = CostFeedback(checked, floor, BudgetChain(LocalBudget(fixed=8), floor), None)
    stream = FakeStream()

    def report(b: int, n: int, start_ms: float) -> StepReport:
        events = recorded_pair(stream, start_ms, curve_ms(b + n))
        tree = SimpleNamespace(num_nodes=n)
        verified = SimpleNamespace(
            request_ids=("r",) * b, tree=tree, forward_s=None, forward_events=events
        )
        return StepReport([], passes=(cast(VerifiedStep, verified),))

    feedback.observe(report(1, 6, 0.0))  # not yet run on the device: nothing read
    assert feedback.live.observed == 0
    stream.run_until(stream.recorded, 100.0)
    feedback.observe(report(1, 2, 100.0))  # the first pair is read now; this one waits
    assert feedback.live.observed == 1
    for _ in range(MIN_SAMPLES):
        stream.run_until(stream.recorded, 300.0)
        feedback.observe(report(1, 6, 200.0))  # reads the previous step's pair
    assert feedback.live.observed == 1 + MIN_SAMPLES
    samples = {b.rows: b.samples for b in feedback.live.buckets()}
    assert samples[3] == 1
    assert samples[7] == MIN_SAMPLES
    assert feedback.live.ready()[7] == pytest.approx(curve_ms(7) / 1e3)
