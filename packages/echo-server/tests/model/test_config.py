"""ModelConfig parsing from HF config.json dicts and GGUF metadata."""

from __future__ import annotations

from typing import Any

import pytest

from echo_server.model.config import RopeScaling, config_from_gguf, config_from_hf
from echo_server.model.errors import ModelLoadError

LLAMA3: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
}


def test_llama3_config_reads_rope_scaling_and_gqa() -> None:
    cfg = config_from_hf(LLAMA3)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (32, 8, 128)
    assert cfg.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    assert cfg.kv_bytes_per_token(2) == 32 * 2 * 8 * 128 * 2


def test_transformers5_rope_parameters_carry_theta() -> None:
    raw = {**LLAMA3, "rope_scaling": None, "rope_theta": None}
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
    cfg = config_from_hf(raw)
    assert cfg.rope_theta == 1e6
    assert cfg.rope_scaling is None


def test_qwen_flags_and_mistral_window() -> None:
    qwen2 = config_from_hf({**LLAMA3, "model_type": "qwen2", "sliding_window": 4096})
    assert qwen2.attention_bias
    assert not qwen2.qk_norm
    assert qwen2.sliding_window is None
    qwen3 = config_from_hf({**LLAMA3, "model_type": "qwen3", "head_dim": 64})
    assert qwen3.qk_norm
    assert qwen3.head_dim == 64
    mistral = config_from_hf({**LLAMA3, "model_type": "mistral", "sliding_window": 4096})
    assert mistral.max_context == 4096


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({**LLAMA3, "model_type": "gpt2"}, "model_type 'gpt2'"),
        ({**LLAMA3, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
        ({**LLAMA3, "num_key_value_heads": 5}, "multiple"),
    ],
)
def test_unsupported_configs_raise_with_the_value(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        config_from_hf(raw)


def test_gguf_metadata_ties_embeddings_when_output_is_absent() -> None:
    meta = {
        "general.architecture": "qwen3",
        "qwen3.block_count": 2,
        "qwen3.embedding_length": 64,
        "qwen3.feed_forward_length": 96,
        "qwen3.attention.head_count": 4,
        "qwen3.attention.head_count_kv": 2,
        "qwen3.attention.key_length": 32,
        "qwen3.context_length": 512,
    }
    names = frozenset({"token_embd.weight", "blk.0.attn_q_norm.weight"})
    cfg = config_from_gguf(meta, names, vocab_size=97)
    assert cfg.tie_word_embeddings
    assert cfg.qk_norm
    assert not cfg.attention_bias
    assert (cfg.vocab_size, cfg.head_dim, cfg.max_position) == (97, 32, 512)
    with pytest.raises(ModelLoadError, match="GGUF metadata lacks llama"):
        config_from_gguf({"general.architecture": "llama"}, names, vocab_size=97)
