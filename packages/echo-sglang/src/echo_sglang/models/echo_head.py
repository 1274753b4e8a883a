"""ECHO's own draft head (echo-server's ``EagleHead``) as an SGLang draft model.

The head, for a row that embeds token ``x`` at position ``p`` with input feature ``f``::

    x0  = fc([rms_f(f) ; rms_e(e(x))]) + W_a [a_1/rms(a_1) ; ... ; a_L/rms(a_L)]   (aux rows)
    h   = x0 + o(attn(rope(q), rope(k), v)),   q, k, v = qkv(rms_1(x0))      (own KV cache)
    f^  = rms_out(h + down(silu(gate(rms_2(h))) * up(rms_2(h))))
    logits = f^ W_d^T over the draft vocabulary; draft index i is target token ``draft_ids[i]``

``rms_*`` carry learned gains, ``a/rms(a)`` none (``rms(v) = sqrt(mean(v^2) + eps)``). Rows
built from the target (the draft-extend pass over committed tokens) read ``f`` = the target's
final hidden state (after its final norm) and ``a_l`` = its residual streams after layers
``aux_layers``; rows built from the head's own prediction (draft decode) read ``f = f^`` of the
parent and no aux term. SGLang runs it as an EAGLE-3 draft: the target captures
``eagle_aux_hidden_state_layer_ids = aux_layers + [L - 1]`` (L target layers); SGLang's Llama
cannot capture after its last layer, so :mod:`echo_sglang.final_capture` appends the final
hidden state for that id. The draft therefore sees ``[a_1 ; ... ; a_L ; f]`` ((L + 1) H wide)
from the target and ``f^`` (H wide) from itself, and tells them apart by width.

Checkpoint: ``scripts/sglang/export_head.py`` writes a directory with ``config.json``
(architecture ``EchoEagleHeadForCausalLM``, model_type ``llama`` for SGLang's config reader,
``echo_head`` holding the head's shapes) and ``model.safetensors`` (names as in this module,
``lm_head.weight`` = the target's output rows of the draft vocabulary, ``draft_ids``). The
embedding is the target's, shared by SGLang's EAGLE-3 worker (``set_embed``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from torch import Tensor, nn

ARCHITECTURE = "EchoEagleHeadForCausalLM"


class _RMSNorm(nn.Module):
    """``w * v / sqrt(mean(v^2) + eps)``, statistics in float32, result in v's dtype."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, v: Tensor) -> Tensor:
        return self.weight * _unit_rms(v, self.eps)


def _unit_rms(v: Tensor, eps: float) -> Tensor:
    """``v / sqrt(mean(v^2) + eps)`` over the last dimension (float32 statistics)."""
    vf = v.float()
    return (vf * torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + eps)).to(v.dtype)


def _rotate(x: Tensor, positions: Tensor, inv: Tensor) -> Tensor:
    """Rotate-half RoPE of ``x`` [T, heads, D] at ``positions`` [T]: angles ``p inv_i`` with
    ``inv_i = theta^(-2i/D)`` (float32, computed once per model)."""
    d = x.shape[-1]
    ang = positions.to(torch.float32)[:, None] * inv.float()
    cos, sin = ang.cos()[:, None, :].to(x.dtype), ang.sin()[:, None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class EchoEagleHeadForCausalLM(nn.Module):
    """The head (module docstring) with SGLang's attention, KV cache and logits processor."""

    inv_freq: Tensor  # [head_dim / 2] RoPE inverse frequencies theta^(-2i / head_dim)

    def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
        super().__init__()
        head = config.echo_head
        self.config = config
        h = self.hidden_size = int(head["hidden_size"])
        self.num_heads, self.num_kv_heads = int(head["num_heads"]), int(head["num_kv_heads"])
        self.head_dim = int(head["head_dim"])
        self.eps, self.theta = float(head["rms_norm_eps"]), float(head["rope_theta"])
        self.num_aux = len(head["aux_layers"])
        inter, draft_vocab = int(head["intermediate_size"]), int(head["draft_vocab_size"])
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim

        class _Model(nn.Module):  # holds embed_tokens where SGLang's EAGLE-3 worker looks
            def __init__(self) -> None:
                super().__init__()
                self.embed_tokens = VocabParallelEmbedding(int(head["target_vocab_size"]), h)

        self.model = _Model()
        self.feature_norm = _RMSNorm(h, self.eps)
        self.token_norm = _RMSNorm(h, self.eps)
        self.fc = nn.Linear(2 * h, h)
        self.aux_fc = nn.Linear(self.num_aux * h, h, bias=False) if self.num_aux else None
        self.attn_norm = _RMSNorm(h, self.eps)
        self.qkv = nn.Linear(h, q + 2 * kv, bias=False)
        self.attn = RadixAttention(
            self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, layer_id=0,
            prefix=f"{prefix}attn",
        )  # fmt: skip
        self.o_proj = nn.Linear(q, h, bias=False)
        self.mlp_norm = _RMSNorm(h, self.eps)
        self.gate_up = nn.Linear(h, 2 * inter, bias=False)
        self.down = nn.Linear(inter, h, bias=False)
        self.final_norm = _RMSNorm(h, self.eps)
        self.lm_head = ParallelLMHead(draft_vocab, h)
        self.register_buffer("draft_ids", torch.arange(draft_vocab), persistent=True)
        steps = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
        self.register_buffer("inv_freq", self.theta**-steps, persistent=False)
        logits_config = copy.deepcopy(config)
        logits_config.vocab_size = draft_vocab  # the processor sizes logits by it
        self.logits_processor = LogitsProcessor(logits_config)
        self.capture_aux_hidden_states = True  # hidden for the next step comes as aux
        self.load_lm_head_from_target = False
        self.hot_token_id: Tensor | None = None

    # -- SGLang's EAGLE-3 worker interface ----------------------------------------------------

    def set_embed(self, embed: Tensor) -> None:
        del self.model.embed_tokens.weight
        self.model.embed_tokens.weight = embed

    def get_embed_and_head(self) -> tuple[Tensor, Tensor]:
        return self.model.embed_tokens.weight, self.lm_head.weight

    # -- forward ------------------------------------------------------------------------------

    def fuse(self, hidden: Tensor, embeds: Tensor) -> Tensor:
        """The decoder layer's input ``x0`` (module docstring) from SGLang's hidden states."""
        h = self.hidden_size
        if hidden.shape[-1] == h:  # the head's own prediction: no aux term
            feature, aux = hidden, None
        elif hidden.shape[-1] == (self.num_aux + 1) * h:
            feature, aux = hidden[..., self.num_aux * h :], hidden[..., : self.num_aux * h]
        else:
            raise ValueError(
                f"{ARCHITECTURE}: hidden states {hidden.shape[-1]} wide, expected {h} (own "
                f"prediction) or {(self.num_aux + 1) * h} (aux layers + final feature from the "
                "target: is the echo plugin's final capture installed?)"
            )
        x: Tensor = self.fc(
            torch.cat([self.feature_norm(feature), self.token_norm(embeds)], dim=-1)
        )
        if aux is not None and self.aux_fc is not None:
            parts = _unit_rms(aux.reshape(*aux.shape[:-1], self.num_aux, h), self.eps)
            x = x + self.aux_fc(parts.reshape(aux.shape))
        return x

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        forward_batch: Any,
        input_embeds: Tensor | None = None,
        pp_proxy_tensors: Any = None,
    ) -> Any:
        embeds = self.model.embed_tokens(input_ids) if input_embeds is None else input_embeds
        hidden = forward_batch.spec_info.hidden_states.to(embeds.dtype)
        if hidden.shape[0] == 0:
            return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch, [hidden])
        x = self.fuse(hidden, embeds)
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv(self.attn_norm(x)).split([q_out, kv_out, kv_out], dim=-1)
        t = x.shape[0]
        q = _rotate(q.reshape(t, self.num_heads, self.head_dim), positions, self.inv_freq)
        k = _rotate(k.reshape(t, self.num_kv_heads, self.head_dim), positions, self.inv_freq)
        attn = self.attn(q.reshape(t, q_out), k.reshape(t, kv_out), v.contiguous(), forward_batch)
        x = x + self.o_proj(attn.reshape(t, q_out))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        feature = self.final_norm(x + self.down(F.silu(gate) * up))
        return self.logits_processor(input_ids, feature, self.lm_head, forward_batch, [feature])

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Copy the checkpoint's tensors (module docstring) into place; ``draft_ids`` also
        becomes ``hot_token_id``, the map SGLang's worker applies to the draft's top-k."""
        saved = set(self.state_dict())  # parameters and persistent buffers (not inv_freq)
        params: dict[str, Tensor] = {
            n: t for n, t in [*self.named_parameters(), *self.named_buffers()] if n in saved
        }
        seen = set()
        for name, tensor in weights:
            if name not in params:
                raise ValueError(f"{ARCHITECTURE}: unexpected checkpoint tensor {name!r}")
            target = params[name]
            if target.shape != tensor.shape:
                raise ValueError(
                    f"{ARCHITECTURE}: {name} is {tuple(tensor.shape)} in the checkpoint, "
                    f"{tuple(target.shape)} in the model"
                )
            with torch.no_grad():
                target.copy_(tensor.to(target.dtype))
            seen.add(name)
        missing = {n for n in params if not n.startswith("model.embed_tokens")} - seen
        if missing:
            raise ValueError(f"{ARCHITECTURE}: checkpoint lacks {sorted(missing)}")
        self.hot_token_id = params["draft_ids"].clone()


EntryClass = [EchoEagleHeadForCausalLM]
