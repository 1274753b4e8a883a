"""With the shipped draft head the engine's greedy output equals plain decoding, token for token.

Real prompts (HumanEval, MT-Bench), batch 1 and batch 4, under ECHO with the shipped GatePolicy.
Acceptance must also be real: a head that drafts noise would pass the identity check trivially.
"""

from __future__ import annotations

import pytest
import torch

from echo_core.sampling import SamplingParams
from echo_gating.policy import GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.policies import make_policy
from echo_server.assets import DEFAULT_GATE, DEFAULT_HEAD
from echo_server.drafting import NgramDrafter
from echo_server.drafting.base import Drafter
from echo_server.drafting.eagle_checkpoint import load_head
from echo_server.drafting.eagle_drafter import EagleDrafter
from echo_server.engine import Engine, EngineConfig, GenerationRequest
from echo_server.model.loader import LoadedModel
from echo_server.prompts import Prompt, humaneval, mtbench

MAX_TOKENS = 32
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not DEFAULT_HEAD.is_file(), reason="no shipped draft head"),
]


def _prompts() -> list[Prompt]:
    return humaneval(2) + mtbench(2)


def _run(
    loaded: LoadedModel, policy: str, drafter: Drafter, max_batch: int
) -> tuple[list[list[int]], float]:
    gate = GatePolicy.load(DEFAULT_GATE) if DEFAULT_GATE.is_file() else None
    cfg = PolicyConfig(base_depth=3, topk=4, num_draft_tokens=25, max_depth=8, max_width=4)
    engine = Engine(
        loaded.model,
        loaded.tokenizer,
        make_policy(policy, cfg, gate if policy == "echo" else None),
        drafter,
        EngineConfig(budget=24 * max_batch, max_batch=max_batch, kv_slots=4096),
    )
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    for p in _prompts():
        engine.submit(GenerationRequest(p.prompt_id, prompt=p.text, chat=p.chat, params=params))
    for _ in engine.run():
        pass
    outputs = [engine.pop_finished(p.prompt_id).output_ids for p in _prompts()]
    return outputs, engine.metrics.acceptance.mean_accepted_length


@pytest.fixture(scope="module")
def plain(smollm: LoadedModel) -> list[list[int]]:
    torch.set_num_threads(1)
    return _run(smollm, "plain", NgramDrafter(), 4)[0]


@pytest.mark.parametrize("max_batch", [1, 4])
def test_greedy_output_with_the_shipped_head_equals_plain_decoding(
    smollm: LoadedModel, plain: list[list[int]], max_batch: int
) -> None:
    weights = smollm.model.weights
    drafter = EagleDrafter(load_head(DEFAULT_HEAD, weights.embed, weights.lm_head))
    outputs, mean_accepted = _run(smollm, "echo", drafter, max_batch)
    assert outputs == plain
    assert mean_accepted > 1.3  # a head drafting noise gives about 1.0
