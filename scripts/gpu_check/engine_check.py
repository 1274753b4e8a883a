"""The engine end to end on one device: greedy ECHO equals plain decoding, token for token.

A seeded random-weight Llama checkpoint (transformers' ``LlamaConfig``, GQA, untied lm_head) is
saved as a HF safetensors directory and loaded by echo-server's own
loader onto the device with :class:`~echo_server.model.KernelsAttention` (Triton on CUDA, its
torch reference on the CPU). The tokenizer is a word-level one over the same vocabulary (no
download). Prompts are random token runs repeated three times, so prompt lookup (the drafter)
finds matches and acceptance is not trivially zero.

For each batch size b (``max_batch = b``) plain decoding and ECHO generate from the same prompts;
output i of ECHO must equal output i of plain. Verifying many rows in one pass reorders float
sums, so a mismatch is tolerated only where plain decoding's own top-2 logit gap at the first
diverging position is below ``NEAR_TIE`` (as in echo-server's tests/engine/test_lossless.py);
such cases are counted in the result, never hidden. The first decode steps also run under
echo-core's :class:`~echo_core.testing.HostSyncCounter` and (non-strict)
:class:`~echo_core.testing.DeviceGuard`, whose counts go into the summary. Every verify pass
must reach the live cost model (engine/pass_timing.py: wall time on the CPU, CUDA events read
without a sync on the GPU): ``timed_passes`` > 0, with the live medians per row count.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

NEAR_TIE = 1e-4
OBSERVED_STEPS = 3  # decode steps counted by the sync counter and the device guard


@dataclass(frozen=True, slots=True)
class EngineSize:
    """Geometry of the random model and of the workload."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    prompts: int
    prompt_run: int  # a prompt is a random run of this many tokens, repeated 3 times
    max_tokens: int
    batches: tuple[int, ...]


GPU_SIZE = EngineSize(512, 1024, 4, 8, 2, 2048, 16, 24, 64, (1, 16))
CPU_SIZE = EngineSize(64, 96, 2, 4, 2, 128, 2, 6, 6, (1, 2))


def save_random_llama(size: EngineSize, path: Path, seed: int = 0) -> None:
    """A seeded random Llama checkpoint at ``path`` in HF layout (``config.json`` from
    transformers' ``LlamaConfig``, ``model.safetensors``). Weights are ``N(0, 0.08^2)`` (wider
    than HF's 0.02 init: decisive argmaxes, fewer ties), norm weights ``1 + N(0, 0.1^2)``."""
    transformers: Any = importlib.import_module("transformers")
    safetensors_torch: Any = importlib.import_module("safetensors.torch")
    head_dim = size.hidden // size.heads
    config = transformers.LlamaConfig(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    config.save_pretrained(path)
    g = torch.Generator().manual_seed(seed)
    q, kv = size.heads * head_dim, size.kv_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (size.vocab, size.hidden)}
    for i in range(size.layers):
        pre = f"model.layers.{i}."
        shapes |= {
            pre + "self_attn.q_proj.weight": (q, size.hidden),
            pre + "self_attn.k_proj.weight": (kv, size.hidden),
            pre + "self_attn.v_proj.weight": (kv, size.hidden),
            pre + "self_attn.o_proj.weight": (size.hidden, q),
            pre + "mlp.gate_proj.weight": (size.intermediate, size.hidden),
            pre + "mlp.up_proj.weight": (size.intermediate, size.hidden),
            pre + "mlp.down_proj.weight": (size.hidden, size.intermediate),
            pre + "input_layernorm.weight": (size.hidden,),
            pre + "post_attention_layernorm.weight": (size.hidden,),
        }
    shapes |= {"model.norm.weight": (size.hidden,), "lm_head.weight": (size.vocab, size.hidden)}
    state = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=g)
        state[name] = 1 + 0.1 * noise if name.endswith("norm.weight") else 0.08 * noise
    safetensors_torch.save_file(state, str(path / "model.safetensors"))


def word_tokenizer(vocab: int) -> Any:
    """echo-server's Tokenizer over a word-level vocabulary ``t0 .. t{vocab-1}`` (EOS: the last)."""
    tokenizers: Any = importlib.import_module("tokenizers")
    transformers: Any = importlib.import_module("transformers")
    from echo_server.model.tokenizer import Tokenizer

    words = {f"t{i}": i for i in range(vocab)}
    raw = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="t0"))
    raw.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=f"t{vocab - 1}")
    return Tokenizer(hf)


def prompts(size: EngineSize, seed: int = 1) -> list[tuple[int, ...]]:
    g = torch.Generator().manual_seed(seed)
    runs = torch.randint(0, size.vocab - 1, (size.prompts, size.prompt_run), generator=g)
    return [tuple(run.tolist() * 3) for run in runs]


def _generate(
    model: Any, tokenizer: Any, policy: str, ids: list[tuple[int, ...]], size: EngineSize, b: int,
    observe: dict[str, Any] | None = None,
) -> tuple[list[list[int]], dict[str, float]]:  # fmt: skip
    from echo_core.sampling import SamplingParams
    from echo_core.testing import DeviceGuard, HostSyncCounter
    from echo_scheduler.policies import make_policy
    from echo_server.drafting import NgramDrafter
    from echo_server.engine import Engine, EngineConfig, GenerationRequest

    engine = Engine(
        model, tokenizer, make_policy(policy), NgramDrafter(),
        EngineConfig(budget=8 * b, max_batch=b, kv_slots=8192),
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=size.max_tokens, ignore_eos=True)
    for i, p in enumerate(ids):
        engine.submit(GenerationRequest(f"r{i}", prompt_ids=p, params=params))
    steps = 0
    while engine.has_work():
        if observe is not None and 0 < steps <= OBSERVED_STEPS:
            on_gpu = engine.device.type != "cpu"  # count real syncs only, not host-side work
            with HostSyncCounter(device_only=on_gpu) as syncs, DeviceGuard(strict=False) as guard:
                engine.step()
            observe.setdefault("host_syncs_per_step", []).append(syncs.total)
            observe.setdefault("device_violations", []).extend(guard.violations)
        else:
            engine.step()
        steps += 1
    outputs = [engine.pop_finished(f"r{i}").output_ids for i in range(len(ids))]
    if observe is not None:  # verify passes timed for the live cost model (pass_timing.py)
        feedback = engine.cost_feedback
        observe["timed_passes"] = feedback.live.observed
        observe["untimed_passes"] = len(feedback.pending.queue) + feedback.pending.dropped
        observe["live_verify_ms"] = {
            str(t): round(s * 1e3, 3) for t, s in sorted(feedback.live.ready().items())
        }
    return outputs, engine.metrics.summary()


def _top2_gap(model: Any, tokenizer: Any, prefix: tuple[int, ...]) -> float:
    """Plain decoding's logit gap between its top two tokens after ``prefix``."""
    from echo_core.sampling import SamplingParams
    from echo_scheduler.policies import make_policy
    from echo_server.drafting import NgramDrafter
    from echo_server.engine import Engine, GenerationRequest
    from echo_server.engine.verify import prefill

    engine = Engine(model, tokenizer, make_policy("plain"), NgramDrafter())
    engine.submit(GenerationRequest("gap", prompt_ids=prefix, params=SamplingParams(0.0, 1)))
    state = engine.requests["gap"]
    state.kv = engine.kv.add_request()
    top = torch.topk(prefill(model, engine.kv, [state]).logits[0].float(), 2).values
    return float(top[0] - top[1])


def compare(
    model: Any, tokenizer: Any, ids: list[tuple[int, ...]], ref: list[list[int]],
    got: list[list[int]],
) -> dict[str, Any]:  # fmt: skip
    """Identical, near-tie and real mismatches of ``got`` against ``ref`` (module docstring)."""
    identical = 0
    near_ties: list[dict[str, Any]] = []
    mismatches: list[dict[str, Any]] = []
    for i, (prompt, a, b) in enumerate(zip(ids, ref, got, strict=True)):
        if a == b:
            identical += 1
            continue
        k = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if k is None:
            mismatches.append({"request": i, "reason": f"lengths {len(a)} vs {len(b)}"})
            continue
        gap = _top2_gap(model, tokenizer, prompt + tuple(a[:k]))
        entry: dict[str, Any] = {"request": i, "position": k, "top2_gap": gap}
        (near_ties if gap < NEAR_TIE else mismatches).append(entry)
    return {"identical": identical, "near_ties": near_ties, "mismatches": mismatches}


def run_engine_check(device: torch.device, size: EngineSize, dtype: torch.dtype) -> dict[str, Any]:
    """Plain vs ECHO at every batch size of ``size``; ``ok`` when no real mismatch."""
    from echo_server.model import KernelsAttention, load_model_only

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        save_random_llama(size, Path(tmp))
        model = load_model_only(tmp, dtype=dtype, device=device, attention=KernelsAttention())
    tokenizer = word_tokenizer(size.vocab)
    ids = prompts(size)
    result: dict[str, Any] = {"device": str(device), "dtype": str(dtype), "batches": {}}
    ok = True
    for b in size.batches:
        plain, _ = _generate(model, tokenizer, "plain", ids, size, b)
        observe: dict[str, Any] = {}
        echo, metrics = _generate(model, tokenizer, "echo", ids, size, b, observe)
        verdict = compare(model, tokenizer, ids, plain, echo)
        timed = observe.get("timed_passes", 0)
        ok = ok and not verdict["mismatches"] and timed > 0
        violations = observe.get("device_violations", [])
        result["batches"][str(b)] = {
            **verdict,
            "requests": len(ids),
            "mean_accepted_length": metrics.get("mean_accepted_length"),
            "host_syncs_per_step": observe.get("host_syncs_per_step", []),
            "device_violations": len(violations),
            "device_violation_sites": sorted(set(violations))[:20],
            "timed_passes": timed,
            "untimed_passes": observe.get("untimed_passes"),
            "live_verify_ms": observe.get("live_verify_ms", {}),
        }
    result["ok"] = ok
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result
