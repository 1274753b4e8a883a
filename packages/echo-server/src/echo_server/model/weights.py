"""Turn a flat HF-named state dict into :class:`ModelWeights` (fused q/k/v and gate/up).

Both loaders (safetensors and GGUF) produce HF names (``model.layers.3.self_attn.q_proj.weight``)
so that this is the one place that knows the layer structure.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from echo_server.model.config import ModelConfig
from echo_server.model.errors import ModelLoadError
from echo_server.model.llama import LayerWeights, ModelWeights

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def assemble_weights(
    config: ModelConfig,
    state: Mapping[str, Tensor],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    rope_freq_divisors: Tensor | None = None,  # [D/2] float32 or None
) -> ModelWeights:
    """Fuse, cast and place the weights; raise :class:`ModelLoadError` naming a missing tensor
    or a shape that disagrees with ``config``."""
    if dtype not in SUPPORTED_DTYPES:
        raise ModelLoadError(f"dtype {dtype} is not one of {SUPPORTED_DTYPES}")

    def get(name: str, shape: tuple[int, ...]) -> Tensor:
        if name not in state:
            raise ModelLoadError(f"checkpoint lacks tensor {name!r}")
        t = state[name]
        if tuple(t.shape) != shape:
            raise ModelLoadError(f"{name} has shape {tuple(t.shape)}, config implies {shape}")
        return t

    def put(t: Tensor) -> Tensor:
        return t.to(device=device, dtype=dtype).contiguous()

    hid, dim = config.hidden_size, config.head_dim
    q_out, kv_out = config.num_heads * dim, config.num_kv_heads * dim
    inter = config.intermediate_size

    def fused(*parts: tuple[str, tuple[int, ...]]) -> Tensor:
        return put(torch.cat([get(name, shape) for name, shape in parts]))

    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        bias = None
        if config.attention_bias:
            bias = fused(
                (a + "q_proj.bias", (q_out,)),
                (a + "k_proj.bias", (kv_out,)),
                (a + "v_proj.bias", (kv_out,)),
            )
        layers.append(
            LayerWeights(
                attn_norm=put(get(p + "input_layernorm.weight", (hid,))),
                qkv=fused(
                    (a + "q_proj.weight", (q_out, hid)),
                    (a + "k_proj.weight", (kv_out, hid)),
                    (a + "v_proj.weight", (kv_out, hid)),
                ),
                qkv_bias=bias,
                q_norm=put(get(a + "q_norm.weight", (dim,))) if config.qk_norm else None,
                k_norm=put(get(a + "k_norm.weight", (dim,))) if config.qk_norm else None,
                o_proj=put(get(a + "o_proj.weight", (hid, q_out))),
                mlp_norm=put(get(p + "post_attention_layernorm.weight", (hid,))),
                gate_up=fused(
                    (p + "mlp.gate_proj.weight", (inter, hid)),
                    (p + "mlp.up_proj.weight", (inter, hid)),
                ),
                down=put(get(p + "mlp.down_proj.weight", (hid, inter))),
            )
        )
    embed = put(get("model.embed_tokens.weight", (config.vocab_size, hid)))
    if config.tie_word_embeddings:
        lm_head = embed
    else:
        lm_head = put(get("lm_head.weight", (config.vocab_size, hid)))
    return ModelWeights(
        embed=embed,
        layers=tuple(layers),
        final_norm=put(get("model.norm.weight", (hid,))),
        lm_head=lm_head,
        rope_freq_divisors=rope_freq_divisors,
    )
