"""GGUF reading: tensor names, llama.cpp's Q/K permutation, tiny GGUFs written here end to end."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from echo_core.tolerance import float_tolerance
from echo_server.kv import KVPool
from echo_server.model import load_model_only, ragged_positions
from echo_server.model.gguf_weights import hf_name, unpermute_rows

VOCAB = 97


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to Llama q/k rows (LlamaModel.permute)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def test_unpermute_inverts_llama_cpp_and_matches_transformers() -> None:
    gguf_utils: Any = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    w = np.random.default_rng(0).standard_normal((3 * 8, 5)).astype(np.float32)
    permuted = llama_cpp_permute(w, 3)
    ours = unpermute_rows(torch.from_numpy(permuted), 3).numpy()
    np.testing.assert_array_equal(ours, w)
    hf = gguf_utils.LlamaTensorProcessor()._reverse_permute_weights(permuted, 3, 3)
    np.testing.assert_array_equal(ours, hf)


@pytest.mark.parametrize(
    ("gguf_name", "expected"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("blk.12.attn_k_norm.weight", "model.layers.12.self_attn.k_norm.weight"),
        ("blk.0.attn_v.bias", "model.layers.0.self_attn.v_proj.bias"),
        ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),
        ("blk.3.mystery.weight", None),
    ],
)
def test_gguf_names_map_to_hf(gguf_name: str, expected: str | None) -> None:
    assert hf_name(gguf_name) == expected


GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_tiny_gguf(arch: str, path: Path) -> Any:
    """A random 2-layer transformers model of ``arch``, written as a float32 GGUF."""
    import gguf

    transformers: Any = importlib.import_module("transformers")
    config_class = {"llama": "LlamaConfig", "qwen3": "Qwen3Config"}[arch]
    config = getattr(transformers, config_class)(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        tie_word_embeddings=arch == "llama",
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(96)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_key_length(16)
    writer.add_context_length(128)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_vocab_size(VOCAB)
    for name, tensor in model.state_dict().items():
        array = tensor.numpy().astype(np.float32)
        if name == "lm_head.weight" and arch == "llama":
            continue  # tied
        if name.startswith("model.layers."):
            layer, rest = name.split(".")[2], name.split(".", 3)[3]
            if arch == "llama" and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
                array = llama_cpp_permute(array, 4 if "q_proj" in rest else 2)
            writer.add_tensor(f"blk.{layer}.{GGUF_NAMES[rest]}", array)
        else:
            top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
                   "output_norm.weight", "lm_head.weight": "output.weight"}[name]  # fmt: skip
            writer.add_tensor(top, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_gguf_loads_to_the_same_logits(arch: str, tmp_path: Path) -> None:
    hf = write_tiny_gguf(arch, tmp_path / "tiny.gguf")
    ours = load_model_only(tmp_path / "tiny.gguf")
    assert ours.config.qk_norm == (arch == "qwen3")
    assert ours.config.tie_word_embeddings == (arch == "llama")
    tokens = torch.arange(5, 30) % VOCAB
    pool = KVPool(ours.config, num_slots=32, max_requests=1)
    handle = pool.add_request()
    batch = pool.attention_batch([handle], [25], pool.allocate(25))
    got = ours.logits(ours.forward(tokens, ragged_positions(batch), batch, pool.storage).hidden)
    with torch.no_grad():
        expected = hf(tokens[None]).logits[0]
    # float32 rounding over max(hidden, intermediate) = 96 and 2 layers: 4.6e-6 to 9.5e-6 for
    # |logit| < ~1.3 (observed: 0, the same op order as transformers).
    c = ours.config
    atol = float_tolerance(
        torch.float32,
        max(c.hidden_size, c.intermediate_size),
        c.num_layers,
        scale=float(expected.abs().max()),
    )
    torch.testing.assert_close(got, expected, atol=atol, rtol=0)
