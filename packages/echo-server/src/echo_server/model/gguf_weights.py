"""Read a GGUF checkpoint: metadata, config and dequantised tensors under HF names.

Tensors are dequantised to float32 with ``gguf.quants.dequantize``. llama.cpp's converter permutes
the rows of ``attn_q``/``attn_k`` of Llama-architecture models (interleaved RoPE pairs); we undo
it so the weights match HF's rotate-half layout: per head of ``2 d`` rows, GGUF row ``2 j + s``
is HF row ``s d + j`` (``s`` in {0, 1}). Qwen2/Qwen3 files are not permuted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog
import torch
from torch import Tensor

from echo_server.model.config import ModelConfig, config_from_gguf
from echo_server.model.errors import ModelLoadError

log = structlog.get_logger(__name__)

PERMUTED_ARCHS = ("llama",)
"""Architectures whose GGUF q/k rows llama.cpp permutes."""

_TOP_LEVEL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_PER_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
ROPE_FREQS = "rope_freqs.weight"


@dataclass(frozen=True, slots=True)
class GGUFCheckpoint:
    """Everything the model needs from one GGUF file."""

    config: ModelConfig
    state: dict[str, Tensor]  # HF names -> float32 tensors
    rope_freq_divisors: Tensor | None  # [D/2] float32, llama3-style frequency factors
    metadata: dict[str, Any]  # scalar and string metadata (arrays left out)


def hf_name(gguf_name: str) -> str | None:
    """HF name of a GGUF tensor (``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj
    .weight``), None for tensors the model does not use."""
    if gguf_name in _TOP_LEVEL:
        return _TOP_LEVEL[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _PER_LAYER:
        return f"model.layers.{parts[1]}.{_PER_LAYER[parts[2]]}"
    return None


def unpermute_rows(w: Tensor, heads: int) -> Tensor:
    """Undo llama.cpp's q/k permutation: [heads * 2d, ...] rows -> HF rotate-half order."""
    d = w.shape[0] // heads // 2
    return w.reshape(heads, d, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def read_metadata(reader: Any) -> dict[str, Any]:
    """Scalar and string fields of a ``gguf.GGUFReader`` (arrays such as the vocabulary skipped)."""
    import gguf

    meta: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if field.types and field.types[0] != gguf.GGUFValueType.ARRAY:
            meta[name] = field.contents()
    return meta


def read_gguf(path: str | Path) -> GGUFCheckpoint:
    """Dequantise every tensor of ``path`` to float32 (llama.cpp Q/K permutation undone)."""
    try:
        import gguf
        from gguf.quants import dequantize
    except ImportError as exc:
        raise ModelLoadError("reading GGUF needs the `gguf` package (extra `models`)") from exc
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {path} does not exist")
    reader = gguf.GGUFReader(str(path))
    meta = read_metadata(reader)
    names = frozenset(t.name for t in reader.tensors)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else 0
    config = config_from_gguf(meta, names, vocab)
    state: dict[str, Tensor] = {}
    divisors = None
    for t in reader.tensors:
        array = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32, copy=True)
        tensor = torch.from_numpy(array)
        if t.name == ROPE_FREQS:
            divisors = tensor
            continue
        name = hf_name(t.name)
        if name is None:
            log.warning("gguf_tensor_ignored", tensor=t.name)
            continue
        if config.arch in PERMUTED_ARCHS and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_heads if "q_proj" in name else config.num_kv_heads
            tensor = unpermute_rows(tensor, heads).contiguous()
        state[name] = tensor
    log.info("gguf_read", path=str(path), arch=config.arch, tensors=len(state))
    return GGUFCheckpoint(config, state, divisors, meta)
