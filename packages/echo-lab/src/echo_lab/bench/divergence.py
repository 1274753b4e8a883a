"""Diagnose a greedy mismatch: the reference's top-2 logit gap where two outputs diverge.

Verifying many tokens in one pass reorders floating-point sums, so a genuine near-tie (gap of
about 1e-5 on fp32 logits) can flip an argmax; a large gap at the diverging position means a
real bug. The benchmark reports the gap beside every mismatch and fails the run either way.
"""

from __future__ import annotations

import torch

from echo_core.sampling import SamplingParams
from echo_scheduler.policies import make_policy
from echo_server.drafting import NgramDrafter
from echo_server.engine import Engine, EngineConfig, GenerationRequest
from echo_server.engine.verify import prefill
from echo_server.model.loader import LoadedModel


def top2_gap(loaded: LoadedModel, prompt_ids: list[int], prefix: list[int]) -> float:
    """Logit gap between the two most likely next tokens after ``prompt_ids + prefix``."""
    ids = tuple(prompt_ids + prefix)
    engine = Engine(
        loaded.model,
        loaded.tokenizer,
        make_policy("plain"),
        NgramDrafter(),
        EngineConfig(budget=0, max_batch=1, kv_slots=len(ids) + 64),
    )
    engine.submit(
        GenerationRequest("gap", prompt_ids=ids, params=SamplingParams(0.0, max_tokens=1))
    )
    state = engine.requests["gap"]
    state.kv = engine.kv.add_request()
    with torch.inference_mode():
        logits = prefill(loaded.model, engine.kv, [state]).logits[0]
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])
