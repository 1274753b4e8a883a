"""Every supported architecture vs transformers' own implementation, on tiny random checkpoints.

Each case saves a random transformers model as a HF safetensors directory, loads it with our
loader, and compares logits of a prefill plus a chunked continuation (cache + several new rows)
and of one decode step. Covers Llama with llama3 RoPE scaling and untied lm_head, Mistral,
Qwen2 (q/k/v bias) and Qwen3 (q/k RMSNorm), GQA throughout.

Tolerances come from :func:`logit_atol` (:mod:`echo_core.tolerance`: dtype, reduction ``max(hidden,
intermediate)`` = 96, the layers compared, the reference's largest |value|). fp32 logits (|logit|
< ~1.3) differ from HF's by float rounding only: tolerance 4.1e-6 to 9.3e-6, observed 1.0e-7 to
2.1e-7. bf16 logits: tolerance 2.7e-2, observed 4.9e-3 (a few bf16 ulps).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import torch

from echo_core.tolerance import float_tolerance
from echo_server.kv import KVPool
from echo_server.model import load_model_only
from echo_server.model.attention import ragged_positions
from echo_server.model.llama import LlamaModel

COMMON: dict[str, Any] = {
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3_rope_untied": (
        "LlamaConfig",
        {
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "llama_tied_linear_rope": (
        "LlamaConfig",
        {
            "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        },
    ),
    "mistral": ("MistralConfig", {"sliding_window": None, "head_dim": 16}),
    "qwen2_bias": ("Qwen2Config", {"tie_word_embeddings": True}),
    "qwen3_qk_norm": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": False}),
}


def logit_atol(model: LlamaModel, expected: torch.Tensor, layers: int | None = None) -> float:
    """Rounding tolerance of ``model``'s outputs after ``layers`` layers (default: all) around
    ``expected``, in the model's dtype (module docstring)."""
    c = model.config
    depth = c.num_layers if layers is None else layers
    reduction = max(c.hidden_size, c.intermediate_size)
    return float_tolerance(model.dtype, reduction, depth, scale=float(expected.abs().max()))


def save_random_model(kind: str, extra: dict[str, Any], path: Path) -> Any:
    transformers: Any = importlib.import_module("transformers")
    torch.manual_seed(0)
    config = getattr(transformers, kind)(**COMMON, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    # Random init leaves norm weights at 1 and biases at 0: perturb them so they matter.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


def our_logits(model: LlamaModel, chunks: list[list[int]]) -> torch.Tensor:
    """Feed ``chunks`` one forward each (causal, growing cache); logits of every row."""
    pool = KVPool(model.config, num_slots=128, max_requests=2, dtype=model.dtype)
    handle = pool.add_request()
    out = []
    for chunk in chunks:
        slots = pool.allocate(len(chunk))
        batch = pool.attention_batch([handle], [len(chunk)], slots)
        tokens = torch.tensor(chunk)
        hidden = model.forward(tokens, ragged_positions(batch), batch, pool.storage).hidden
        pool.append([handle], slots, [len(chunk)])
        out.append(model.logits(hidden))
    return torch.cat(out)


@pytest.mark.parametrize("case", list(CASES))
def test_tiny_model_matches_transformers(case: str, tmp_path: Path) -> None:
    kind, extra = CASES[case]
    hf = save_random_model(kind, extra, tmp_path)
    ours = load_model_only(tmp_path)
    tokens = torch.randint(
        0, COMMON["vocab_size"], (23,), generator=torch.Generator().manual_seed(1)
    )
    chunks = [tokens[:9].tolist(), tokens[9:22].tolist(), tokens[22:].tolist()]
    with torch.no_grad():
        expected = hf(tokens[None]).logits[0]
    atol = logit_atol(ours, expected)
    torch.testing.assert_close(our_logits(ours, chunks), expected, atol=atol, rtol=0)


def test_bf16_tiny_model_close_to_transformers_bf16(tmp_path: Path) -> None:
    kind, extra = CASES["qwen3_qk_norm"]
    hf = save_random_model(kind, extra, tmp_path).to(torch.bfloat16)
    ours = load_model_only(tmp_path, dtype=torch.bfloat16)
    assert ours.dtype == torch.bfloat16
    tokens = torch.arange(3, 40) % COMMON["vocab_size"]
    with torch.no_grad():
        expected = hf(tokens[None]).logits[0].float()
    got = our_logits(ours, [tokens.tolist()])
    torch.testing.assert_close(got, expected, atol=logit_atol(ours, expected), rtol=0)


def test_aux_layers_return_the_residual_stream(tmp_path: Path) -> None:
    hf = save_random_model(*CASES["qwen2_bias"], tmp_path)
    ours = load_model_only(tmp_path)
    pool = KVPool(ours.config, num_slots=32, max_requests=1)
    handle = pool.add_request()
    tokens = torch.arange(1, 8)
    slots = pool.allocate(7)
    batch = pool.attention_batch([handle], [7], slots)
    out = ours.forward(tokens, ragged_positions(batch), batch, pool.storage, aux_layers=(1, 0))
    with torch.no_grad():
        states = hf(tokens[None], output_hidden_states=True).hidden_states
    # HF hidden_states[i + 1] is the output of layer i; the last entry is final-normed.
    after_first = states[1][0]
    torch.testing.assert_close(
        out.aux[1], after_first, atol=logit_atol(ours, after_first, layers=1), rtol=0
    )
    last = states[-1][0]
    torch.testing.assert_close(out.hidden, last, atol=logit_atol(ours, last), rtol=0)
    with pytest.raises(ValueError, match="aux_layers"):
        ours.forward(tokens, ragged_positions(batch), batch, pool.storage, aux_layers=(5,))
