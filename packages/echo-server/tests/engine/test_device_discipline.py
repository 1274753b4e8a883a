"""Device discipline of the engine step, checked on the CPU (issue #18).

On a CPU every tensor is on the CPU, so a factory without ``device=`` or an op mixing a host
tensor into device work runs fine here and fails (or silently lands on the CPU) on a GPU.
:class:`~echo_core.testing.DeviceGuard` makes both visible: every decode step of the engine,
with either drafter, under a strict guard. Before this test the step created its caps, roots,
verify tokens, attention metadata, masks and report fields without a device (12 call sites),
and the EAGLE drafter copied its state to the CPU (``.cpu()``) and built its masks, rows and
proposals there (10 more).
"""

from __future__ import annotations

import pytest

from echo_core.sampling import SamplingParams
from echo_core.testing import DeviceGuard
from echo_scheduler.policies import make_policy
from echo_server.drafting import Drafter, NgramDrafter
from echo_server.drafting.eagle_drafter import eagle_drafter_for
from echo_server.drafting.mixture import MixtureDrafter
from echo_server.engine import Engine, EngineConfig, GenerationRequest
from echo_server.model.loader import LoadedModel

PROMPTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The capital of France is Paris. The capital of Italy is",
    "List three prime numbers: 2, 3,",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(",
)


def _engine(loaded: LoadedModel, policy: str, drafter: Drafter, batch: int) -> Engine:
    engine = Engine(
        loaded.model,
        loaded.tokenizer,
        make_policy(policy),
        drafter,
        EngineConfig(budget=4 * batch, max_batch=batch, kv_slots=4096),
    )
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for i, text in enumerate(PROMPTS[:batch]):
        engine.submit(GenerationRequest(f"r{i}", prompt=text, params=params))
    return engine


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["ngram", "eagle", "eagle+ngram"])
def test_every_decode_step_keeps_its_tensors_on_the_engine_device(
    smollm: LoadedModel, drafter: str
) -> None:
    d: Drafter = NgramDrafter()
    if drafter.startswith("eagle"):
        eagle = eagle_drafter_for(smollm.model)
        d = MixtureDrafter(eagle, NgramDrafter()) if drafter == "eagle+ngram" else eagle
    engine = _engine(smollm, "echo", d, 4)
    engine.step()  # admission + prefill: its first tokens
    steps = 0
    while engine.has_work() and steps < 3:
        with DeviceGuard(strict=False) as guard:
            engine.step()
        assert guard.violations == []
        steps += 1
    assert steps == 3
