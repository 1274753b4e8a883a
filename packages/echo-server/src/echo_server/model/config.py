"""Model hyper-parameters of the Llama family, from a HF ``config.json`` or GGUF metadata.

One frozen :class:`ModelConfig` covers Llama 2/3, SmolLM2, Mistral, Qwen2/2.5 and Qwen3: they
differ only in head sizes, RoPE variant (theta, llama3 or linear scaling), q/k/v bias (Qwen2),
per-head q/k RMSNorm (Qwen3) and whether the lm_head is tied to the embedding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from echo_server.model.errors import ModelLoadError

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
"""``model_type`` (HF) / ``general.architecture`` (GGUF) values this implementation runs."""

ROPE_KINDS = ("default", "linear", "llama3")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE frequency scaling: ``linear`` (all frequencies / factor) or ``llama3`` (by band)."""

    kind: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes and numerics of one decoder-only Llama-family model."""

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    qk_norm: bool = False
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise ModelLoadError(f"architecture {self.arch!r} is not one of {SUPPORTED_ARCHS}")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ModelLoadError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def max_context(self) -> int:
        """Longest sequence served exactly: positions, capped by a sliding window if any.

        Sliding-window attention is not implemented; within the window it equals full attention,
        so capping the context keeps every served sequence exact.
        """
        if self.sliding_window is None:
            return self.max_position
        return min(self.max_position, self.sliding_window)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache bytes of one token over all layers: ``L * 2 * Hkv * D * dtype_bytes``."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * dtype_bytes


def _rope_from_hf(params: Mapping[str, Any] | None) -> RopeScaling | None:
    if not params:
        return None
    kind = str(params.get("rope_type", params.get("type", "default")))
    if kind == "default":
        return None
    if kind not in ROPE_KINDS:
        raise ModelLoadError(f"rope scaling {kind!r} is not supported (supported: {ROPE_KINDS})")
    return RopeScaling(
        kind=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
    )


def config_from_hf(cfg: Mapping[str, Any]) -> ModelConfig:
    """Parse a HF ``config.json`` dict (transformers 4.x ``rope_theta``/``rope_scaling`` keys or
    5.x ``rope_parameters``)."""
    arch = str(cfg.get("model_type", ""))
    if arch not in SUPPORTED_ARCHS:
        raise ModelLoadError(f"model_type {arch!r} is not one of {SUPPORTED_ARCHS}")
    rope_params = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    theta = cfg.get("rope_theta")
    if theta is None and isinstance(rope_params, Mapping):
        theta = rope_params.get("rope_theta")
    heads = int(cfg["num_attention_heads"])
    window = cfg.get("sliding_window")
    if arch.startswith("qwen") and not cfg.get("use_sliding_window", False):
        window = None
    return ModelConfig(
        arch=arch,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta if theta is not None else 10000.0),
        max_position=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=arch == "qwen3",
        rope_scaling=_rope_from_hf(rope_params if isinstance(rope_params, Mapping) else None),
        sliding_window=int(window) if window else None,
    )


def config_from_gguf(
    meta: Mapping[str, Any], tensor_names: frozenset[str], vocab_size: int
) -> ModelConfig:
    """Parse GGUF metadata (llama.cpp key names ``{arch}.block_count`` ...).

    ``tensor_names`` decides what the metadata does not say: a missing ``output.weight`` means a
    tied lm_head, ``blk.0.attn_q.bias`` means q/k/v bias. ``vocab_size`` is the token count.
    """
    arch = str(meta.get("general.architecture", ""))
    if arch not in SUPPORTED_ARCHS:
        raise ModelLoadError(f"GGUF architecture {arch!r} is not one of {SUPPORTED_ARCHS}")

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{name}")
        return value

    hidden = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    scaling_kind = str(meta.get(f"{arch}.rope.scaling.type", "none"))
    scaling = None
    if scaling_kind == "linear":
        scaling = RopeScaling(kind="linear", factor=float(key("rope.scaling.factor")))
    elif scaling_kind not in ("none", ""):
        raise ModelLoadError(f"GGUF rope scaling {scaling_kind!r} is not supported")
    # llama3-style scaling is stored as a ``rope_freqs.weight`` tensor, applied by the loader.
    return ModelConfig(
        arch=arch,
        vocab_size=int(meta.get(f"{arch}.vocab_size", vocab_size)),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(key("attention.key_length", hidden // heads)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        max_position=int(key("context_length", 4096)),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        rope_scaling=scaling,
        sliding_window=None,
    )
