"""Host syncs of one ECHO decode step: a budget per drafted depth that the batch size never grows.

On CUDA every counted call (:class:`~echo_core.testing.HostSyncCounter`: ``.item()``,
``.tolist()``, ``bool()``/``int()`` of a tensor, boolean-mask indexing, ``nonzero``, ...) stalls
the host until the device catches up. The policy decides depth by depth on the host, so a step
syncs a few dozen times per drafted depth; what must not happen is a sync per request or per node.
Budget: ``SYNCS_PER_DEPTH * depths + SYNCS_PER_STEP`` at every batch size.

Measured when the test was written (tiny random Llama, n-gram drafter, the engine's default
attention, B = 1 / 4 / 16): 52 syncs at 1 depth, 237 and 249 at 8 depths. Before it the same
steps cost 61 more at 8 depths: ECHO's tier order gathered by boolean masks four times per
call, ``ranks_in_order`` gathered group starts by mask, and the child-key estimate gathered the
depth's nodes by mask. (The CPU reference of echo-kernels' tree attention, used with
``KernelsAttention`` off CUDA, still loops per request: about 7 syncs each. On CUDA that path is
the Triton kernel.)

On 2026-12-06 ECHO's decisions lost most of theirs (issue #44): one read of three flags and
one ``nonzero`` per depth (two where the budget or a cap binds), the selection and its exact
cut none. The same steps then cost 49-62 syncs at 1 depth and 148-181 at 8 depths (ECHO's own
share, on the recorded pools: 6-15 per step against 21-74 before,
packages/echo-lab/scripts/policy_syncs.py), and the budget went from 30 per depth + 40 to 20 + 50
(the same 70 at one depth, 200 rather than 280 at eight).

Since 2026-12-05 (``96e0c7c``) the default CPU attention's lane mirrors
(echo_server.model.kv_mirror) sync twice per
mirrored forward (the lanes to the host, one ``nonzero`` for the columns to copy), whatever the
batch; they start at contexts of 1,024 tokens, so these short steps never use them (mirrored from
the first token, the first observed step at B = 16, which also prefills, went from 70 to 74).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import torch

from echo_core.sampling import SamplingParams
from echo_core.testing import HostSyncCounter
from echo_scheduler.device import driver
from echo_scheduler.device.adapter import DeviceEchoPolicy
from echo_scheduler.policies import make_policy
from echo_server.assets import DEFAULT_GATE
from echo_server.cli.options import gate_for
from echo_server.drafting import NgramDrafter
from echo_server.drafting.eagle_drafter import eagle_drafter_for
from echo_server.engine import Engine, EngineConfig, FinishReason, GenerationRequest, speculate
from echo_server.model import load_model_only
from echo_server.model.loader import LoadedModel
from echo_server.prompts import humaneval, mtbench

SYNCS_PER_DEPTH = 20
SYNCS_PER_STEP = 50
VOCAB = 97
OBSERVED_STEPS = 3


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A seeded random two-layer Llama (GQA) saved as a HF checkpoint and loaded by our loader."""
    transformers: Any = importlib.import_module("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
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


def _observed(model: Any, smollm: LoadedModel, batch: int) -> list[tuple[int, int]]:
    """(host syncs, drafted depths) of OBSERVED_STEPS decode steps at ``batch``."""
    engine = Engine(
        model,
        smollm.tokenizer,  # decodes ids < VOCAB; only the step's tensors matter here
        make_policy("echo"),
        NgramDrafter(),  # prompts repeat a run, so prompt lookup drafts deep
        EngineConfig(budget=8 * batch, max_batch=batch, kv_slots=8192),
    )
    g = torch.Generator().manual_seed(batch)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for i in range(batch):
        run = torch.randint(0, VOCAB, (6,), generator=g).tolist()
        engine.submit(GenerationRequest(f"r{i}", prompt_ids=tuple(run * 4), params=params))
    engine.step()  # admission and prefill
    depths = [0]
    after_depth = engine.policy.after_depth

    def counted(pool: Any) -> Any:
        depths[0] += 1
        return after_depth(pool)

    engine.policy.after_depth = counted  # type: ignore[method-assign]
    out = []
    for _ in range(OBSERVED_STEPS):
        depths[0] = 0
        with HostSyncCounter() as syncs:
            engine.step()
        out.append((syncs.total, depths[0]))
    return out


def test_step_syncs_grow_with_drafted_depth_not_with_batch(
    tiny_llama: Any, smollm: LoadedModel
) -> None:
    seen = {b: _observed(tiny_llama, smollm, b) for b in (1, 4, 16)}
    for steps in seen.values():
        for total, depths in steps:
            assert total <= SYNCS_PER_DEPTH * depths + SYNCS_PER_STEP, seen
    assert max(d for _, d in seen[16]) >= 4, seen  # the large batch really drafted deep


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 4])
def test_echo_devices_policy_part_reads_one_value_a_step(
    smollm: LoadedModel, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    """Issue #44: with ``echo_device`` the engine drives the fixed layout's loop
    (echo_scheduler.device.driver.drive), and the policy's calls inside a step (begin, every
    depth, the selection) read one value, the live count of the caps, whatever the batch and
    the depth; the drafter's source reads its counts outside them. The shipped head and gate,
    the elastic floor, real prompts."""
    inside = HostSyncCounter()
    steps: list[tuple[int, int]] = []  # (reads in the policy's calls, depths) per step

    def counted(*args: Any, **kwargs: Any) -> Any:
        before = inside.total
        run = driver.drive(*args, **kwargs, around=lambda: inside)
        steps.append((inside.total - before, run.depths))
        return run

    monkeypatch.setattr(speculate, "drive", counted)
    policy = make_policy("echo_device", gate=gate_for("echo_device", DEFAULT_GATE, 8))
    assert isinstance(policy, DeviceEchoPolicy)
    maps = policy.gate.acceptance_maps
    assert maps is not None
    policy._best_first(maps, torch.device("cpu"))  # read once per set of maps, not per step
    engine = Engine(
        smollm.model,
        smollm.tokenizer,
        policy,
        eagle_drafter_for(smollm.model),
        EngineConfig(budget=24, max_batch=batch, kv_slots=8192, elastic=True),
    )
    params = SamplingParams(temperature=0.0, max_tokens=24)
    for p in humaneval(2)[:batch] + mtbench(2)[: max(batch - 2, 0)]:
        engine.submit(GenerationRequest(p.prompt_id, prompt=p.text, chat=p.chat, params=params))
    reasons = {e.finish_reason for e in engine.run() if e.finish_reason is not None}
    assert FinishReason.ERROR not in reasons
    assert len(steps) >= 8
    assert max(reads for reads, _ in steps) <= 1, (steps, dict(inside.sites))
    assert max(depths for _, depths in steps) >= 2, steps  # it drafted past depth 1
