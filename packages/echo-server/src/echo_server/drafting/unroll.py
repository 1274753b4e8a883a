"""Training-time drafting: the head unrolled over ``K`` depths on teacher-forced sequences.

A drafted node at depth k reads the head's own predicted feature, not the target's, so training
only on target features (depth 1) leaves deeper depths out of distribution. As in HASS and
EAGLE-3 the head is unrolled: pass 1 runs every row t on the target's feature, pass k runs
row t on pass k-1's prediction and the true token ``x_{t+k}``::

    pass 1, row t: in (f_t, x_{t+1})          at position t+1 -> predicts f_{t+1}
    pass k, row t: in (f^{k-1}_t, x_{t+k})    at position t+k -> predicts f_{t+k}

Pass k's row t is exactly the depth-(k-1) draft node after root ``x_{t+1}`` whose path is
``x_{t+2} .. x_{t+k}``, so it attends to what that node sees at inference: pass-1 rows ``<= t``
(the committed context) plus rows t of passes 2..k (its ancestors and itself).

Batches are dense: ``features`` [B, T, H], ``tokens`` [B, T+1]; rows of padding never matter
because the attention is causal and losses are masked.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from echo_server.drafting.eagle_head import EagleHead


def _expand_kv(t: Tensor, groups: int) -> Tensor:
    """[B, T, Hkv, D] -> [B, Hq, T, D] (GQA heads repeated)."""
    return t.transpose(1, 2).repeat_interleave(groups, dim=1)


def unrolled_features(
    head: EagleHead,
    features: Tensor,  # [B, T, H] float32, target features f_0..f_{T-1}
    tokens: Tensor,  # [B, T+1] int64, x_0..x_T
    depths: int,
    aux: Tensor | None = None,  # [B, T, L*H] target residual streams (heads with aux_layers)
) -> list[Tensor]:
    """Predicted features of passes 1..depths, each [B, T, H] (row t of pass k ~ f_{t+k}).

    Only pass 1 reads ``aux``: its rows are built from target features, as the committed rows
    and depth 1 are at inference; deeper passes read the head's own predictions."""
    c = head.config
    b, t, _ = features.shape
    groups = c.num_heads // c.num_kv_heads
    scale = c.head_dim**-0.5
    pos = torch.arange(t, device=features.device)[None, :].expand(b, t)
    causal = torch.ones(t, t, dtype=torch.bool, device=features.device).tril()

    x1 = head.fuse(features, tokens[:, 1 : t + 1], aux)
    q1, k1, v1 = head.project(x1, pos + 1)
    k_ctx, v_ctx = _expand_kv(k1, groups), _expand_kv(v1, groups)  # [B, Hq, T, D]
    attn = F.scaled_dot_product_attention(q1.transpose(1, 2), k_ctx, v_ctx, attn_mask=causal)
    out = [head.finish(x1, attn.transpose(1, 2).reshape(b, t, -1))]
    diag_k: list[Tensor] = []
    diag_v: list[Tensor] = []
    for k in range(2, depths + 1):
        # tokens beyond the sequence end are padding; their rows are masked out of the loss
        tok = F.pad(tokens[:, k:], (0, k - 1))[:, :t]
        x = head.fuse(out[-1], tok)
        q, kk, vv = head.project(x, pos + k)
        qh = q.transpose(1, 2)  # [B, Hq, T, D]
        diag_k.append(_expand_kv(kk, groups))
        diag_v.append(_expand_kv(vv, groups))
        ctx = (qh @ k_ctx.transpose(-1, -2)) * scale  # [B, Hq, T, T]
        ctx = ctx.masked_fill(~causal, float("-inf"))
        diag = torch.stack([(qh * dk).sum(-1) * scale for dk in diag_k], dim=-1)  # [B,Hq,T,k-1]
        probs = torch.softmax(torch.cat([ctx, diag], dim=-1), dim=-1)
        mixed = probs[..., :t] @ v_ctx
        mixed = mixed + sum(probs[..., t + j, None] * dv for j, dv in enumerate(diag_v))
        out.append(head.finish(x, mixed.transpose(1, 2).reshape(b, t, -1)))
    return out


def pass_mask(answer_from: Tensor, lengths: Tensor, t: int, k: int) -> Tensor:
    """[B, T] bool: rows of pass k with a target (``t + k < T_b``) inside the answer
    (its label token ``x_{t+k+1}`` is generated: ``t + k + 1 >= prompt_len``)."""
    rows = torch.arange(t, device=lengths.device)[None, :]
    return (rows + k < lengths[:, None]) & (rows + k + 1 >= answer_from[:, None])
