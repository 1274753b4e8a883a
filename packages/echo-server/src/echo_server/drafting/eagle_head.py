"""The EAGLE-style draft head: one Llama decoder layer over fused (target feature, next token).

For a committed row t the head reads the target's final hidden state ``f_t`` (the lm_head input)
and the embedding of the token that follows, ``e(x_{t+1})``, and predicts the *next* feature::

    x   = fc([rms(f_t) ; rms(e(x_{t+1}))])                       (2H -> H, with bias)
    h   = x + o(attn(rope(q), rope(k), v))     q, k, v = qkv(rms(x))   (own small KV cache)
    h'  = h + down(silu(gate(rms(h))) * up(rms(h)))
    f^  = rms(h')                                                 predicted f_{t+1}
    log q(y) = log_softmax(f^ W_d^T)  over the draft vocabulary    W_d = lm_head[draft_ids]

Row t sits at position ``t + 1`` (the position of the token it embeds). Drafting deeper feeds
``f^`` back as the feature of the next row.

Optional EAGLE-3-style multi-layer features (``aux_layers`` non-empty): rows built from target
features (committed rows, i.e. the head's context and depth 1) also read the residual streams
``a^l_t`` after target layers ``l`` in ``aux_layers``::

    x  += W_a [ a^{l_1}_t / rms(a^{l_1}_t) ; ... ]               (L*H -> H, no bias, zero-init)

Rows built from the head's own prediction (depth >= 2) have no such term; a zero-initialised
``W_a`` makes the head start as the single-feature one.

The draft vocabulary is the ``V_d`` most frequent target tokens (``draft_ids`` maps draft index
-> target id); ``W_d`` and the embedding table are the target's own rows (tied SmolLM2: both are
its embedding), attached at load time and never stored in the head's checkpoint, so the head
file holds only ~4M parameters (+ L*H*H for aux layers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from echo_server.model.linear import Linear, packing_available
from echo_server.model.rope import rotate

HEAD_FORMAT = "echo-eagle-head/1"


@dataclass(frozen=True, slots=True)
class EagleHeadConfig:
    """Shapes of a head and the target it was trained for."""

    hidden_size: int  # H, the target's hidden size
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    draft_vocab_size: int  # V_d
    target_vocab_size: int  # V of the target (draft ids must lie below it)
    rms_norm_eps: float = 1e-5
    rope_theta: float = 100000.0
    target: str = ""  # the target's name, for error messages and data cards
    aux_layers: tuple[int, ...] = ()  # target layers whose residual streams depth 1 reads

    def __post_init__(self) -> None:
        layers = tuple(self.aux_layers)
        if any(not isinstance(x, int) or x < 0 for x in layers) or list(layers) != sorted(
            set(layers)
        ):
            raise ValueError(f"aux_layers must be increasing non-negative ints, got {layers}")
        object.__setattr__(self, "aux_layers", layers)
        for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads or self.head_dim % 2:
            raise ValueError(
                f"need num_heads % num_kv_heads == 0 and even head_dim, got {self.num_heads}, "
                f"{self.num_kv_heads}, {self.head_dim}"
            )
        if not 1 <= self.draft_vocab_size <= self.target_vocab_size:
            raise ValueError(
                f"draft_vocab_size {self.draft_vocab_size} must lie in [1, "
                f"target_vocab_size={self.target_vocab_size}]"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"format": HEAD_FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> EagleHeadConfig:
        fields = {k: v for k, v in obj.items() if k != "format"}
        return cls(**fields)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """``weight * x / sqrt(mean(x^2) + eps)``, statistics in float32, result in x's dtype."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_tables(
    positions: Tensor, dim: int, theta: float, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` [..., 1, D/2] of the angles ``p theta^(-2i/D)`` at ``positions`` [...]
    (computed in float32, returned in ``dtype``), shared by every head's rotation."""
    inv = theta ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)
    ang = positions.to(torch.float32)[..., None] * inv  # [..., D/2]
    return ang.cos().unsqueeze(-2).to(dtype), ang.sin().unsqueeze(-2).to(dtype)


def rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotate-half RoPE of ``x`` [..., heads, D] at ``positions`` [...] int64 (HF Llama layout;
    the rotation is :func:`~echo_server.model.rope.rotate`)."""
    return rotate(x, *rope_tables(positions, x.shape[-1], theta, x.dtype))


class EagleHead(nn.Module):
    """Parameters and the per-row pieces of the head (module docstring); attention is the
    caller's (drafter: context + tree; trainer: causal + unrolled)."""

    draft_ids: Tensor  # [V_d] int64, draft index -> target id (saved)
    embed: Tensor  # [V, H] float32, the target's embedding (attached, not saved)
    out_rows: Tensor  # [V_d, H] float32, the target's lm_head rows of the draft vocabulary

    def __init__(self, config: EagleHeadConfig) -> None:
        super().__init__()
        c = self.config = config
        h, q, kv = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.feature_norm = RMSNorm(h, c.rms_norm_eps)
        self.token_norm = RMSNorm(h, c.rms_norm_eps)
        self.fc = nn.Linear(2 * h, h)
        self.attn_norm = RMSNorm(h, c.rms_norm_eps)
        self.qkv = nn.Linear(h, q + 2 * kv, bias=False)
        self.o_proj = nn.Linear(q, h, bias=False)
        self.mlp_norm = RMSNorm(h, c.rms_norm_eps)
        self.gate_up = nn.Linear(h, 2 * c.intermediate_size, bias=False)
        self.down = nn.Linear(c.intermediate_size, h, bias=False)
        self.final_norm = RMSNorm(h, c.rms_norm_eps)
        self.aux_fc: nn.Linear | None = None
        if c.aux_layers:
            self.aux_fc = nn.Linear(len(c.aux_layers) * h, h, bias=False)
            nn.init.zeros_(self.aux_fc.weight)
        self.register_buffer("draft_ids", torch.arange(c.draft_vocab_size), persistent=True)
        # Target rows, attached by attach_target (not saved with the head).
        self.register_buffer("embed", torch.zeros(0, h), persistent=False)
        self.register_buffer("out_rows", torch.zeros(0, h), persistent=False)
        self._packed: _Projections | None = None  # inference-only packed projections

    # -- target rows --------------------------------------------------------------------------

    def attach_target(self, embed: Tensor, lm_head: Tensor) -> None:
        """Share the target's embedding ([V, H]) and take its lm_head rows of the draft vocab."""
        c = self.config
        for name, t in (("embed", embed), ("lm_head", lm_head)):
            if t.shape != (c.target_vocab_size, c.hidden_size):
                raise ValueError(
                    f"target {name} is {tuple(t.shape)}, the head needs "
                    f"({c.target_vocab_size}, {c.hidden_size})"
                )
        dev = self.fc.weight.device
        self.embed = embed.detach().to(device=dev, dtype=torch.float32)
        self.out_rows = lm_head.detach()[self.draft_ids.to(lm_head.device)].to(dev, torch.float32)

    @property
    def attached(self) -> bool:
        return self.embed.shape[0] > 0

    def pack_for_inference(self) -> bool:
        """Serve the projections through oneDNN-packed weights (model/linear.py); training
        (autograd) keeps ``nn.Linear``. float32 and bfloat16 CPU heads pack; returns whether it
        did. Call again after changing the weights, :meth:`unpack` to drop the packed copies."""
        if not self.attached or not packing_available(self.fc.weight, allow_bf16=True):
            self.unpack()
            return False

        def pack(weight: Tensor, bias: Tensor | None = None) -> Linear:
            return Linear(weight.detach(), None if bias is None else bias.detach(), True)

        self._packed = _Projections(
            pack(self.fc.weight, self.fc.bias),
            pack(self.qkv.weight),
            pack(self.o_proj.weight),
            pack(self.gate_up.weight),
            pack(self.down.weight),
            pack(self.out_rows),
            None if self.aux_fc is None else pack(self.aux_fc.weight),
        )
        return True

    def _projections(self) -> _Projections:
        """The packed projections when packed, else the modules (autograd-capable)."""
        if self._packed is not None:
            return self._packed
        return _Projections(
            self.fc,
            self.qkv,
            self.o_proj,
            self.gate_up,
            self.down,
            lambda f: f @ self.out_rows.T,
            self.aux_fc,
        )

    def unpack(self) -> None:
        self._packed = None

    # -- the row pipeline ---------------------------------------------------------------------

    def fuse(
        self,
        feature: Tensor,  # [..., H] float32, target feature (or the head's own prediction)
        token: Tensor,  # [...] int64 target ids of the following token
        aux: Tensor | None = None,  # [..., L*H] residual streams after aux_layers (target rows)
    ) -> Tensor:
        """The decoder layer's input ``fc([rms(f); rms(e(x))])`` (+ the aux term when ``aux`` is
        given, module docstring): [..., H]."""
        emb = self.embed[token].to(feature.dtype)  # the shared float32 table (EagleDrafter)
        fused = torch.cat([self.feature_norm(feature), self.token_norm(emb)], dim=-1)
        p = self._projections()
        x = p.fc(fused)
        if aux is None:
            return x
        if p.aux_fc is None:
            raise ValueError("aux features given to a head trained without aux_layers")
        h = self.config.hidden_size
        parts = aux.reshape(*aux.shape[:-1], -1, h).float()
        parts = parts * torch.rsqrt(parts.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return x + p.aux_fc(parts.reshape(aux.shape).to(x.dtype))

    def project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q [..., Hq, D], k and v [..., Hkv, D] of rows ``x`` [..., H] at ``positions``."""
        c = self.config
        q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        qkv = self._projections().qkv(self.attn_norm(x))
        q, k, v = torch.split(qkv, [q_out, kv_out, kv_out], dim=-1)
        lead = x.shape[:-1]
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta, qkv.dtype)  # once for q, k
        q = rotate(q.reshape(*lead, c.num_heads, c.head_dim), cos, sin)
        k = rotate(k.reshape(*lead, c.num_kv_heads, c.head_dim), cos, sin)
        return q, k, v.reshape(*lead, c.num_kv_heads, c.head_dim)

    def finish(self, x: Tensor, attn: Tensor) -> Tensor:
        """Residual, MLP, final norm: the predicted feature [..., H] from ``attn`` [..., Hq*D]."""
        p = self._projections()
        h = x + p.o_proj(attn)
        gate, up = p.gate_up(self.mlp_norm(h)).chunk(2, dim=-1)
        out: Tensor = self.final_norm(h + p.down(F.silu(gate) * up))
        return out

    def logits(self, feature: Tensor) -> Tensor:
        """Draft-vocabulary logits [..., V_d] of predicted features [..., H]."""
        return self._projections().logits(feature)

    def target_ids(self, draft_index: Tensor) -> Tensor:
        """Map draft-vocabulary indices to target token ids (same shape, int64)."""
        return self.draft_ids[draft_index]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def default_config(
    hidden_size: int,
    target_vocab_size: int,
    draft_vocab_size: int,
    target: str = "",
    aux_layers: tuple[int, ...] = (),
) -> EagleHeadConfig:
    """The shipped shape for a target of width ``hidden_size``: 64-wide heads, 3 KV heads, MLP
    ``8/3 H`` (SmolLM2-135M: 9 heads, MLP 1536; about 4.2M parameters)."""
    heads = max(1, hidden_size // 64)
    kv = 3 if heads % 3 == 0 else 1
    inter = (8 * hidden_size // 3 + 63) // 64 * 64
    return EagleHeadConfig(
        hidden_size=hidden_size,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=64,
        intermediate_size=inter,
        draft_vocab_size=draft_vocab_size,
        target_vocab_size=target_vocab_size,
        target=target,
        aux_layers=aux_layers,
    )


Projection = Callable[[Tensor], Tensor]


@dataclass(frozen=True, slots=True)
class _Projections:
    """The head's projections: packed :class:`Linear` for inference, or the modules."""

    fc: Projection
    qkv: Projection
    o_proj: Projection
    gate_up: Projection
    down: Projection
    logits: Projection
    aux_fc: Projection | None = None
