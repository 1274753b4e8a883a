"""The Llama-family decoder: one forward over packed ragged rows, for prefill and verify alike.

Per layer (pre-norm residual blocks, HF Llama semantics)::

    h = x + o_proj(attention(rope(q), rope(k), v))   with q, k, v = split(qkv_proj(rms(x)))
    x' = h + down(silu(gate(rms(h))) * up(rms(h)))

``rms(x) = w * x / sqrt(mean(x^2) + eps)``, computed in float32 and cast back (as HF does).
Qwen2 adds q/k/v biases, Qwen3 an RMSNorm over each q and k head before RoPE. q/k/v and
gate/up are stored fused (one matmul each). New rows' K/V go to the KV pool slots the caller
gives; attention reads the pool through an :class:`AttentionBackend`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import torch
import torch.nn.functional as F
from torch import Tensor

from echo_server.model.attention import AttentionBackend, AttentionBatch
from echo_server.model.config import ModelConfig
from echo_server.model.kv_mirror import MirrorConfig
from echo_server.model.linear import Linear, RowPaths, row_paths
from echo_server.model.rope import RotaryTable, rotate
from echo_server.model.torch_attention import TorchAttention

log = structlog.get_logger(__name__)


def default_mirror(config: ModelConfig, dtype: torch.dtype) -> MirrorConfig:
    """The lane mirrors of the default CPU attention for a model (echo_server.model.kv_mirror):
    one attend per layer, ``Hkv D`` elements of ``dtype`` per token and layer."""
    row_bytes = config.num_kv_heads * config.head_dim * torch.empty((), dtype=dtype).element_size()
    return MirrorConfig(config.num_layers, row_bytes)


@dataclass(frozen=True, slots=True)
class LayerWeights:
    """One decoder layer; ``Q = H * D``, ``K = Hkv * D``, ``I`` = MLP width."""

    attn_norm: Tensor  # [hidden]
    qkv: Tensor  # [Q + 2K, hidden]
    qkv_bias: Tensor | None  # [Q + 2K] (Qwen2)
    q_norm: Tensor | None  # [D] (Qwen3)
    k_norm: Tensor | None  # [D] (Qwen3)
    o_proj: Tensor  # [hidden, Q]
    mlp_norm: Tensor  # [hidden]
    gate_up: Tensor  # [2I, hidden], gate rows first
    down: Tensor  # [hidden, I]


@dataclass(frozen=True, slots=True)
class ModelWeights:
    """All parameters in the model dtype; ``lm_head`` is ``embed`` itself when tied. In a built
    :class:`LlamaModel`, packed layer projections read :data:`RELEASED` here (their values live
    in ``LlamaModel.linears``)."""

    embed: Tensor  # [V, hidden]
    layers: tuple[LayerWeights, ...]
    final_norm: Tensor  # [hidden]
    lm_head: Tensor  # [V, hidden]
    rope_freq_divisors: Tensor | None = None  # [D/2] float32 (GGUF llama3 ``rope_freqs``)


@dataclass(frozen=True, slots=True)
class ForwardOutput:
    """What one forward returns."""

    hidden: Tensor  # [R, hidden] model dtype, final-normed: the lm_head input (EAGLE feature)
    aux: tuple[Tensor, ...]  # per aux_layers entry l: [R, hidden] residual stream after layer l


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``weight * x / sqrt(mean(x^2, -1) + eps)``, statistics in float32: same shape as x."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class LlamaModel:
    """Inference-only Llama-family model over a slot-indexed KV pool (module docstring)."""

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        attention: AttentionBackend[Any] | None = None,
    ) -> None:
        if len(weights.layers) != config.num_layers:
            raise ValueError(f"{len(weights.layers)} layers of weights, config says {config}")
        self.config = config
        self.weights = weights
        self.attention: AttentionBackend[Any] = attention or TorchAttention(
            mirror=default_mirror(config, weights.embed.dtype)
        )
        self.rope = RotaryTable(
            config, weights.embed.dtype, weights.embed.device, weights.rope_freq_divisors
        )
        self.scale = config.head_dim**-0.5
        self.linears = tuple(_LayerLinears.of(layer) for layer in weights.layers)
        self.lm_head = Linear(weights.lm_head)
        self.row_paths = _choose_row_paths(self.linears, self.lm_head)
        self.weights = _release_packed(weights, self.linears)

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.weights.embed.device

    @torch.no_grad()
    def forward(
        self,
        tokens: Tensor,  # [R] int64
        positions: Tensor,  # [R] int64
        batch: AttentionBatch,
        kv_cache: Tensor,  # [L, 2, S, Hkv, D] model dtype, the KV pool storage (written)
        aux_layers: Sequence[int] = (),
    ) -> ForwardOutput:
        """Run the new rows, write their K/V at ``batch.write_slots``, return hidden states."""
        cfg = self.config
        n = tokens.numel()
        if positions.shape != (n,) or batch.num_rows != n:
            raise ValueError(
                f"tokens [{n}], positions {tuple(positions.shape)} and batch rows "
                f"{batch.num_rows} must agree"
            )
        if kv_cache.dtype != self.dtype or kv_cache.shape[0] != cfg.num_layers:
            raise ValueError(
                f"kv_cache {tuple(kv_cache.shape)} {kv_cache.dtype} does not fit a "
                f"{cfg.num_layers}-layer {self.dtype} model"
            )
        if any(not 0 <= layer_id < cfg.num_layers for layer_id in aux_layers):
            raise ValueError(f"aux_layers {list(aux_layers)} outside 0..{cfg.num_layers - 1}")
        if n and int(positions.max()) >= cfg.max_position:
            raise ValueError(f"position {int(positions.max())} >= max_position {cfg.max_position}")
        if n == 0:
            empty = self.weights.embed.new_zeros(0, cfg.hidden_size)
            return ForwardOutput(empty, tuple(empty for _ in aux_layers))
        plan = self.attention.plan(batch)
        cos, sin = self.rope.lookup(positions)  # [R, 1, D/2] each, shared by every layer
        heads, kv_heads, dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        captured: dict[int, Tensor] = {}
        x = self.weights.embed[tokens]  # [R, hidden]
        for i, (layer, mm) in enumerate(zip(self.weights.layers, self.linears, strict=True)):
            h = rms_norm(x, layer.attn_norm, eps)
            qkv = mm.qkv(h).view(n, heads + 2 * kv_heads, dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q = rotate(rms_norm(qkv[:, :heads], layer.q_norm, eps), cos, sin)
                k = rotate(rms_norm(qkv[:, heads : heads + kv_heads], layer.k_norm, eps), cos, sin)
            else:
                qk = rotate(qkv[:, : heads + kv_heads], cos, sin)
                q, k = qk[:, :heads], qk[:, heads:]
            v = qkv[:, heads + kv_heads :]
            k_cache, v_cache = kv_cache[i, 0], kv_cache[i, 1]
            k_cache.index_copy_(0, batch.write_slots, k)
            v_cache.index_copy_(0, batch.write_slots, v)
            attn = self.attention.attend(plan, q, k, v, k_cache, v_cache, self.scale)  # [R, H, D]
            x = x + mm.o_proj(attn.reshape(n, heads * dim))
            gate, up = mm.gate_up(rms_norm(x, layer.mlp_norm, eps)).chunk(2, dim=-1)
            x = x + mm.down(F.silu(gate) * up)
            if i in aux_layers:
                captured[i] = x
        aux = tuple(captured[i] for i in aux_layers)
        return ForwardOutput(rms_norm(x, self.weights.final_norm, eps), aux)

    @torch.no_grad()
    def logits(
        self,
        hidden: Tensor,  # [R, hidden] model dtype
        rows: Tensor | None = None,  # [M] int64 rows that need logits; None = all
    ) -> Tensor:
        """``lm_head(hidden[rows])``: [M, V] float32 (only the requested rows pay the matmul)."""
        h = hidden if rows is None else hidden[rows]
        return self.lm_head(h).float()


def _choose_row_paths(linears: tuple[_LayerLinears, ...], lm_head: Linear) -> dict[str, RowPaths]:
    """Per projection name, how its few-row calls run (1-row path and row padding, linear.py
    docstring): decided once by timing every layer's projection of that name, applied to all."""
    chosen: dict[str, RowPaths] = {}
    if not linears:
        return chosen
    for name in ("qkv", "o_proj", "gate_up", "down"):
        group = [getattr(mm, name) for mm in linears]
        chosen[name] = paths = row_paths(group)
        paths.apply(group)
    chosen["lm_head"] = paths = row_paths(lm_head)
    paths.apply(lm_head)
    log.info(
        "linear_row_paths",
        **{
            n: f"{'plain' if p.plain_single_row else 'packed'} pad={list(p.pad_to)}"
            for n, p in chosen.items()
        },
    )
    return chosen


RELEASED = torch.empty(0)
"""What a layer projection's plain tensor becomes in ``LlamaModel.weights`` once its packed copy
serves every call (``LlamaModel.linears`` holds the values)."""


def _release_packed(weights: ModelWeights, linears: tuple[_LayerLinears, ...]) -> ModelWeights:
    """``weights`` without the plain copies of packed layer projections (one copy in memory)."""
    layers = []
    for layer, mm in zip(weights.layers, linears, strict=True):
        released = {
            name: RELEASED
            for name in ("qkv", "o_proj", "gate_up", "down")
            if getattr(mm, name).release_plain()
        }
        layers.append(dataclasses.replace(layer, **released) if released else layer)
    return dataclasses.replace(weights, layers=tuple(layers))


@dataclass(frozen=True, slots=True)
class _LayerLinears:
    """One layer's projections as :class:`Linear` (oneDNN-packed on a float32 CPU)."""

    qkv: Linear
    o_proj: Linear
    gate_up: Linear
    down: Linear

    @staticmethod
    def of(layer: LayerWeights) -> _LayerLinears:
        return _LayerLinears(
            Linear(layer.qkv, layer.qkv_bias),
            Linear(layer.o_proj),
            Linear(layer.gate_up),
            Linear(layer.down),
        )
