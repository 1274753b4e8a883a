"""RoPE: the worked example, scaling variants vs transformers, GGUF frequency divisors."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from echo_server.model.config import ModelConfig, RopeScaling
from echo_server.model.rope import RotaryTable, inv_frequencies


def config(head_dim: int = 8, theta: float = 10000.0, **kw: Any) -> ModelConfig:
    return ModelConfig(
        arch="llama",
        vocab_size=10,
        hidden_size=head_dim * 2,
        intermediate_size=8,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=head_dim,
        rms_norm_eps=1e-6,
        rope_theta=theta,
        max_position=16,
        tie_word_embeddings=True,
        **kw,
    )


def test_quarter_turn_maps_first_half_onto_second() -> None:
    table = RotaryTable(config(head_dim=2, theta=1.0), torch.float64)
    # D = 2, f = 1: angle at position p is p radians; use a table row at p = pi/2 directly.
    table.cos[1], table.sin[1] = math.cos(math.pi / 2), math.sin(math.pi / 2)
    x = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    rotated = table.apply(x, torch.tensor([1]))
    torch.testing.assert_close(rotated, torch.tensor([[[0.0, 1.0]]], dtype=torch.float64))


def test_rotation_preserves_norm_and_relative_angle() -> None:
    table = RotaryTable(config(head_dim=8), torch.float64)
    gen = torch.Generator().manual_seed(0)
    q, k = (
        torch.randn(1, 1, 8, generator=gen, dtype=torch.float64),
        torch.randn(1, 1, 8, generator=gen, dtype=torch.float64),
    )
    dot = [
        float((table.apply(q, torch.tensor([p + 3])) * table.apply(k, torch.tensor([p]))).sum())
        for p in range(4)
    ]
    # q.k depends only on the position difference (angles are float32, hence 1e-6).
    assert max(dot) - min(dot) < 1e-6
    torch.testing.assert_close(table.apply(q, torch.tensor([5])).norm(), q.norm())


@pytest.mark.parametrize(
    ("params", "scaling"),
    [
        (
            {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
        ),
        ({"rope_type": "linear", "factor": 4.0}, RopeScaling("linear", 4.0)),
    ],
)  # fmt: skip
def test_scaled_frequencies_match_transformers(
    params: dict[str, Any], scaling: RopeScaling
) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = LlamaConfig(
        hidden_size=1024,
        num_attention_heads=8,
        max_position_embeddings=131072,
        rope_parameters={**params, "rope_theta": 500000.0},
    )
    expected, _ = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf, "cpu")
    ours = inv_frequencies(config(head_dim=128, theta=500000.0, rope_scaling=scaling))
    torch.testing.assert_close(ours, expected.float(), rtol=1e-6, atol=0)


def test_gguf_frequency_divisors_divide() -> None:
    base = inv_frequencies(config())
    divisors = torch.tensor([1.0, 2.0, 4.0, 8.0])
    torch.testing.assert_close(inv_frequencies(config(), divisors), base / divisors)
