"""Chunked prefill: the grant formula, a bounded stall, exact outputs, drafter feedback, cancel."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from echo_core.sampling import SamplingParams
from echo_scheduler.policies import make_policy
from echo_server.cli.options import prefill_chunk_arg
from echo_server.drafting import Drafter, NgramDrafter
from echo_server.drafting.base import TargetFeedback
from echo_server.engine import Engine, EngineConfig, GenerationRequest
from echo_server.engine.chunking import chunk_rows
from echo_server.engine.request import Phase
from echo_server.model.loader import LoadedModel

SHORT = "List three colours of the rainbow."
LONG = (
    "Summarise the following notes in one sentence. The harbour opened in 1820, grew with the "
    "railway after 1850, lost its fishing fleet in the 1960s and now serves ferries and yachts; "
    "the old warehouses became flats, a museum and a market hall."
)


def test_grants_fill_the_budget_in_arrival_order() -> None:
    assert chunk_rows([700, 5, 40], 256) == [256, 0, 0]
    assert chunk_rows([188, 5, 40], 256) == [188, 5, 40]
    assert chunk_rows([250, 5, 40], 256) == [250, 5, 1]
    assert chunk_rows([3, 9], None) == [3, 9]
    assert chunk_rows([], 8) == []


@pytest.mark.parametrize(("left", "budget"), [([4], 0), ([0, 3], 8), ([2], -1)])
def test_bad_grants_are_refused(left: list[int], budget: int) -> None:
    with pytest.raises(ValueError, match="prefill"):
        chunk_rows(left, budget)


def test_the_cli_takes_a_chunk_or_off() -> None:
    assert prefill_chunk_arg("64") == 64
    assert prefill_chunk_arg("off") is None
    for bad in ("0", "many"):
        with pytest.raises(argparse.ArgumentTypeError, match="'off'"):
            prefill_chunk_arg(bad)


@pytest.mark.parametrize("chunk", [0, -3])
def test_engine_config_refuses_a_non_positive_chunk(chunk: int) -> None:
    with pytest.raises(ValueError, match="prefill_chunk"):
        EngineConfig(prefill_chunk=chunk)


class RecordingDrafter(NgramDrafter):
    """Prompt lookup that also keeps every feedback the engine sends."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[TargetFeedback] = []

    def observe(self, feedback: TargetFeedback) -> None:
        self.seen.append(feedback)
        super().observe(feedback)


def _engine(
    loaded: LoadedModel, policy: str, drafter: Drafter | None = None, **config: Any
) -> Engine:
    cfg = replace(EngineConfig(budget=16, max_batch=4, kv_slots=4096), **config)
    return Engine(
        loaded.model, loaded.tokenizer, make_policy(policy), drafter or NgramDrafter(), cfg
    )


def _requests(max_tokens: int = 16) -> list[GenerationRequest]:
    params = SamplingParams(0.0, max_tokens=max_tokens)
    return [
        GenerationRequest("short", prompt=SHORT, params=params),
        GenerationRequest("long", prompt=LONG, params=params),
        GenerationRequest("ids", prompt_ids=(1, 504, 3260, 281, 1351, 30), params=params),
    ]


def _outputs(engine: Engine, requests: Sequence[GenerationRequest]) -> dict[str, list[int]]:
    for r in requests:
        engine.submit(r)
    for _ in engine.run():
        pass
    return {r.request_id: engine.pop_finished(r.request_id).output_ids for r in requests}


@pytest.mark.parametrize("policy", ["plain", "echo"])
def test_chunked_prefill_emits_what_whole_prefill_emits(smollm: LoadedModel, policy: str) -> None:
    """Chunks only reorder float sums of the prompt's K/V (test_smollm_parity's chunked test):
    greedy outputs are the same, and ECHO stays lossless against plain decoding."""
    whole = _outputs(_engine(smollm, "plain", prefill_chunk=None), _requests())
    assert _outputs(_engine(smollm, policy, prefill_chunk=7), _requests()) == whole


def test_a_long_prompt_does_not_stall_the_running_batch(smollm: LoadedModel) -> None:
    engine = _engine(smollm, "echo", prefill_chunk=8)
    params = SamplingParams(0.0, max_tokens=200, ignore_eos=True)
    engine.submit(GenerationRequest("short", prompt=SHORT, params=params))
    while engine.requests["short"].phase is not Phase.RUNNING:
        engine.step()  # "short" is longer than one chunk too
    engine.submit(GenerationRequest("long", prompt=LONG, params=params))
    prompt = len(engine.requests["long"].prompt_ids)
    assert prompt > 3 * 8
    cached, steps = 0, 0
    while steps == 0 or engine.requests["long"].phase is Phase.PREFILLING:
        before = len(engine.requests["short"].output_ids)
        report = engine.step()
        steps += 1
        state = engine.requests["long"]
        assert state.kv is not None
        now = engine.kv.cache_len(state.kv)
        if state.phase is Phase.PREFILLING:
            assert now - cached == 8  # exactly one chunk per step
            assert report.batch == 1  # ... and the running request decoded beside it
        cached = now
        assert len(engine.requests["short"].output_ids) > before
    assert steps == -(-prompt // 8)  # the last chunk's step also samples the first token
    assert report.admitted == 1
    assert report.batch == 2


def test_the_drafter_sees_each_chunk_with_the_token_that_follows_it(
    smollm: LoadedModel,
) -> None:
    drafter = RecordingDrafter()
    engine = _engine(smollm, "echo", drafter, prefill_chunk=5)
    request = _requests(max_tokens=4)[1]
    engine.submit(request)
    engine.step()
    while engine.requests["long"].phase is Phase.PREFILLING:
        engine.step()
    prompt = engine.requests["long"].prompt_ids
    first_output = engine.requests["long"].output_ids[0]
    chunks = drafter.seen[: -(-len(prompt) // 5)]
    tokens = [t for f in chunks for t in f.tokens.tolist()]
    positions = [p for f in chunks for p in f.positions.tolist()]
    assert tokens == prompt
    assert positions == list(range(len(prompt)))
    following = [*prompt[1:], first_output]
    for f in chunks:
        last = f.positions[-1].item()
        assert f.next_token.tolist() == [following[int(last)]]


def test_cancelling_a_prefilling_request_frees_its_kv(smollm: LoadedModel) -> None:
    engine = _engine(smollm, "echo", prefill_chunk=4)
    free = engine.kv.num_free
    engine.submit(_requests()[1])
    engine.step()
    state = engine.requests["long"]
    assert state.phase is Phase.PREFILLING
    assert state.kv is not None
    assert engine.kv.cache_len(state.kv) == 4
    event = engine.cancel("long")
    assert event is not None
    assert event.finish_reason is not None
    assert engine.kv.num_free == free
    assert not engine.has_work()
