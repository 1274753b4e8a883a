"""ECHO inside a real SGLang server on the CPU (conftest): greedy output equal to SGLang's own
plain and EAGLE-3 output, acceptance happening, feedback reaching the policy, bad requests.

Prompts: HumanEval (sent raw), MT-Bench first turns (chat template) and prompts built like the
head's training data with another seed (hold-out style), as token ids through ``/generate`` so
every server sees exactly the same input. The servers run float32 (harness). Tests that need a
speculative server take ``spec`` (ECHO, ECHO as ``echo_device``, then SGLang's EAGLE-3 with the same
head), so pytest runs all of one mode's tests before starting the next.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import pytest

from echo_lab.sglang.harness import Environment, Server
from echo_lab.training.instructions import build_prompts
from echo_server.prompts import humaneval, mtbench

pytestmark = [pytest.mark.sglang_server, pytest.mark.slow]

NEW_TOKENS = 64
Prompts = tuple[tuple[str, tuple[int, ...]], ...]


@cache
def prompt_ids(model_dir: str) -> Prompts:
    """(name, token ids) of the test prompts (module docstring)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = [*humaneval(3), *mtbench(3), *build_prompts(300, seed=7)[:2]]
    out = []
    for p in prompts:
        text = p.text
        if p.chat:
            text = tok.apply_chat_template(
                [{"role": "user", "content": p.text}], add_generation_prompt=True, tokenize=False
            )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        out.append((p.prompt_id, tuple(int(t) for t in ids)))
    return tuple(out)


@pytest.fixture(scope="module")
def prompts(sglang_env: Environment) -> Prompts:
    return prompt_ids(str(sglang_env.model))


@pytest.fixture(scope="module")
def plain_outputs(server: Callable[[str], Server], prompts: Prompts) -> dict[str, list[int]]:
    plain = server("plain")
    return {name: plain.generate(ids, NEW_TOKENS)["output_ids"] for name, ids in prompts}


@pytest.fixture(scope="module", params=["echo", "echo_device", "eagle3"])
def spec(
    request: pytest.FixtureRequest,
    server: Callable[[str], Server],
    plain_outputs: dict[str, list[int]],
) -> Server:
    """A speculative server (module docstring); plain outputs are taken before it starts."""
    return server(str(request.param))


def accept_length(bodies: list[dict[str, Any]]) -> float:
    """Tokens per verify pass over ``bodies``: sum of completion tokens / sum of verify steps."""
    tokens = sum(int(b["meta_info"]["completion_tokens"]) for b in bodies)
    steps = sum(int(b["meta_info"].get("spec_verify_ct", 0)) for b in bodies)
    return tokens / steps if steps else 1.0


def test_greedy_output_equals_plain_sglang_one_at_a_time(
    spec: Server, prompts: Prompts, plain_outputs: dict[str, list[int]]
) -> None:
    bodies = []
    for name, ids in prompts:
        body = spec.generate(ids, NEW_TOKENS)
        assert body["output_ids"] == plain_outputs[name], f"{spec.mode} differs on {name}"
        bodies.append(body)
    mal = accept_length(bodies)
    print(f"{spec.mode}: mean accepted length {mal:.2f} over {len(bodies)} prompts")
    assert mal > 1.0, f"{spec.mode} accepted no draft token ({mal:.2f} tokens per verify pass)"


def test_greedy_output_equals_plain_sglang_at_concurrency_4(
    spec: Server, prompts: Prompts, plain_outputs: dict[str, list[int]]
) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        bodies = list(pool.map(lambda p: spec.generate(p[1], NEW_TOKENS), prompts))
    for (name, _), body in zip(prompts, bodies, strict=True):
        assert body["output_ids"] == plain_outputs[name], f"{spec.mode} at c=4 differs on {name}"
    assert accept_length(bodies) > 1.0


@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": -5}},
        {"input_ids": [1, 2, 3], "sampling_params": {"temperature": -1.0}},
        {"input_ids": [10**9], "sampling_params": {"max_new_tokens": 4}},
        {"input_ids": list(range(9000)), "sampling_params": {"max_new_tokens": 4}},
    ],
    ids=["negative-max-new-tokens", "negative-temperature", "token-id-out-of-range", "too-long"],
)
def test_a_bad_request_gets_an_error_and_the_server_keeps_serving(
    spec: Server, prompts: Prompts, plain_outputs: dict[str, list[int]], body: dict[str, Any]
) -> None:
    code, answer = spec.post("/generate", body)
    assert 400 <= code < 500, (code, answer)
    name, ids = prompts[0]
    assert spec.generate(ids, NEW_TOKENS)["output_ids"] == plain_outputs[name]


@pytest.mark.parametrize("mode", ["echo", "echo_device"])
def test_verify_feedback_reaches_the_policy_and_the_drift_monitor(
    server: Callable[[str], Server], prompts: Prompts, mode: str
) -> None:
    echo = server(mode)
    before = _feedback(echo)
    body = echo.generate(prompts[0][1], NEW_TOKENS)
    after = _feedback(echo)
    meta = body["meta_info"]
    assert after["steps"] - before["steps"] == int(meta["spec_verify_ct"])
    assert after["accepted"] - before["accepted"] == int(meta["spec_num_correct_drafts"])
    assert after["drift_records"] > before["drift_records"]


def _feedback(server: Server) -> dict[str, int]:
    """The last ``echo_feedback`` totals the server logged (zeros before the first)."""
    found = re.findall(r"echo_feedback (steps=\d+ accepted=\d+ verified=\d+ drift_records=\d+)",
                       server.log_text())  # fmt: skip
    if not found:
        return {"steps": 0, "accepted": 0, "verified": 0, "drift_records": 0}
    return {k: int(v) for k, v in (kv.split("=") for kv in found[-1].split())}
