"""Bad requests get clear errors and disturb nothing; sampling is seeded; finishes are right."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

from echo_core.errors import SamplingParamsError
from echo_core.sampling import SamplingParams
from echo_scheduler.policies import make_policy
from echo_server.drafting import Drafter, NgramDrafter
from echo_server.engine import (
    Engine,
    EngineConfig,
    FinishReason,
    GenerationRequest,
    RequestError,
    StepEvent,
)
from echo_server.model.loader import LoadedModel

PROMPT = "List three colours of the rainbow."


def _engine(loaded: LoadedModel, policy: str = "echo", **config: Any) -> Engine:
    cfg = replace(EngineConfig(budget=16, max_batch=4, kv_slots=4096), **config)
    return Engine(loaded.model, loaded.tokenizer, make_policy(policy), NgramDrafter(), cfg)


def _run(engine: Engine, *requests: GenerationRequest) -> dict[str, list[int]]:
    for r in requests:
        engine.submit(r)
    for _ in engine.run():
        pass
    return {r.request_id: engine.pop_finished(r.request_id).output_ids for r in requests}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"temperature": float("nan")}, "temperature"),
    ],
)
def test_impossible_sampling_params_are_rejected(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(SamplingParamsError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_empty_prompt_is_rejected() -> None:
    with pytest.raises(RequestError, match="empty"):
        GenerationRequest("e", prompt="   ")


def test_bad_requests_fail_alone_while_others_finish(smollm: LoadedModel) -> None:
    engine = _engine(smollm, max_context=256)
    good = GenerationRequest("good", prompt=PROMPT, params=SamplingParams(0.0, max_tokens=12))
    engine.submit(good)
    with pytest.raises(RequestError, match="context"):
        engine.submit(GenerationRequest("long", prompt="word " * 400))
    with pytest.raises(RequestError, match="token ids"):
        engine.submit(GenerationRequest("ids", prompt_ids=(1, 10**9)))
    with pytest.raises(RequestError, match="already in use"):
        engine.submit(GenerationRequest("good", prompt=PROMPT))
    for _ in engine.run():
        pass
    state = engine.pop_finished("good")
    assert len(state.output_ids) == 12
    assert state.finish_reason is FinishReason.LENGTH
    reference = _run(_engine(smollm, "plain"), good)["good"]
    assert state.output_ids == reference


def test_seeded_sampling_is_reproducible_and_batch_independent(smollm: LoadedModel) -> None:
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=24, seed=1234)
    alone = _run(_engine(smollm), GenerationRequest("s", prompt=PROMPT, params=params))["s"]
    again = _run(_engine(smollm), GenerationRequest("s", prompt=PROMPT, params=params))["s"]
    other = GenerationRequest("o", prompt="Name a fruit.", params=SamplingParams(0.0, max_tokens=8))
    batched = _run(_engine(smollm), GenerationRequest("s", prompt=PROMPT, params=params), other)
    assert alone == again
    assert batched["s"] == alone


def test_stop_string_cuts_the_text_before_it(smollm: LoadedModel) -> None:
    params = SamplingParams(0.0, max_tokens=32)
    full = _engine(smollm)
    full.submit(GenerationRequest("full", prompt=PROMPT, params=params))
    for _ in full.run():
        pass
    text = full.pop_finished("full").text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    engine = _engine(smollm)
    stopped = SamplingParams(0.0, max_tokens=32, stop=(stop,))
    engine.submit(GenerationRequest("stop", prompt=PROMPT, params=stopped))
    streamed = "".join(event.text for event in engine.run())
    state = engine.pop_finished("stop")
    assert state.finish_reason is FinishReason.STOP
    assert state.text == text[: text.index(stop)]
    assert streamed.startswith(state.text)


def test_cancel_frees_the_kv_at_once(smollm: LoadedModel) -> None:
    engine = _engine(smollm)
    free = engine.kv.num_free
    engine.submit(GenerationRequest("c", prompt=PROMPT, params=SamplingParams(0.0, max_tokens=40)))
    engine.step()
    assert engine.kv.num_free < free
    event = engine.cancel("c")
    assert event is not None
    assert event.finish_reason is FinishReason.CANCELLED
    assert engine.kv.num_free == free
    assert not engine.has_work()


def test_requests_beyond_the_pool_wait_instead_of_failing(smollm: LoadedModel) -> None:
    engine = _engine(smollm, kv_slots=160, budget=8, max_batch=4)
    reqs = [
        GenerationRequest(f"w{i}", prompt=PROMPT, params=SamplingParams(0.0, max_tokens=16))
        for i in range(3)
    ]
    outputs = _run(engine, *reqs)
    assert all(len(o) == 16 for o in outputs.values())


def test_a_request_whose_step_fails_finishes_alone_with_an_error(
    smollm: LoadedModel, out_of_vocab_drafter: Callable[[int], Drafter]
) -> None:
    prompts = {"a": (11, 12, 13, 14, 11, 12, 13), "b": (21, 22, 23, 21, 22), "c": (31, 32, 33)}
    params = SamplingParams(0.0, max_tokens=10)
    clean = _run(
        _engine(smollm),
        *(GenerationRequest(rid, prompt_ids=ids, params=params) for rid, ids in prompts.items()),
    )
    cfg = EngineConfig(budget=16, max_batch=4, kv_slots=4096)
    engine = Engine(
        smollm.model, smollm.tokenizer, make_policy("echo"), out_of_vocab_drafter(21), cfg
    )
    for rid, ids in prompts.items():
        engine.submit(GenerationRequest(rid, prompt_ids=ids, params=params))
    events: list[StepEvent] = []
    while engine.has_work():
        events += engine.step().events
    failed = [e for e in events if e.finish_reason is FinishReason.ERROR]
    assert [e.request_id for e in failed] == ["b"]
    assert failed[0].error is not None
    assert "IndexError" in failed[0].error
    for rid in ("a", "c"):  # the others lose nothing: same output as without the bad request
        assert engine.pop_finished(rid).output_ids == clean[rid]
    assert engine.pop_finished("b").finish_reason is FinishReason.ERROR
    assert engine.kv.num_free == engine.kv.num_slots  # the failed steps' slots came back


def test_a_step_runs_in_inference_mode_and_its_state_works_between_steps(
    smollm: LoadedModel,
) -> None:
    """Engine.step runs the policy, the drafter and the model in inference mode (README: the
    step's small ops skip autograd); between steps, outside it, the engine still admits,
    cancels and reports."""
    engine = _engine(smollm)
    seen: list[bool] = []
    begin = engine.policy.begin_step

    def spy(batch: Any) -> Any:
        seen.append(torch.is_inference_mode_enabled())
        return begin(batch)

    engine.policy.begin_step = spy  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    engine.submit(GenerationRequest("a", prompt=PROMPT, params=params))
    engine.submit(GenerationRequest("b", prompt=PROMPT, params=params))
    engine.step()
    engine.step()
    assert not torch.is_inference_mode_enabled()
    assert seen
    assert all(seen)
    cancelled = engine.cancel("b")  # state created inside a step, changed outside one
    assert cancelled is not None
    out = _run(engine, GenerationRequest("c", prompt=PROMPT, params=params))
    assert len(out["c"]) == 6
    assert len(engine.pop_finished("a").output_ids) == 6
