"""Step phases 4-5 and prefill: target forwards over packed ragged rows, then acceptance.

Prefill runs each admitted request's prompt as causal rows after an empty cache and keeps all of
their K/V; the logits of each prompt's last row give its first output token.

Verify runs, per request, its root (last emitted token) then its tree nodes, at positions
``cache_len + depth`` with the tree mask (root + ancestors-or-self visible, plus the cached
prefix). Every row's K/V is written into freshly allocated slots; commit keeps the accepted.

Acceptance: all-greedy batches use the greedy rule on the argmax; otherwise every row's target
distribution comes from its request's temperature / top-k / top-p (temperature 0 rows become
one-hot, for which the stochastic rule reduces to the greedy one), drafted candidates count as
deterministic (top-k) candidates, and each request draws its uniforms from its own seeded
generator, so a seeded request's output does not depend on what else is in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from echo_core.acceptance import AcceptResult, greedy_accept
from echo_core.acceptance_stochastic import AcceptUniforms, stochastic_accept
from echo_core.layouts import verify_positions
from echo_core.sampling import stack_sampling_params, target_probs
from echo_core.tree import TreeBatch
from echo_core.verify_rows import node_rows, root_rows
from echo_server.engine.request import RequestState
from echo_server.kv.pool import KVPool, RequestHandle
from echo_server.model.attention import ragged_positions, tree_row_mask
from echo_server.model.llama import LlamaModel


def prefill(model: LlamaModel, kv: KVPool, states: Sequence[RequestState]) -> Tensor:
    """Prefill the prompts of ``states`` (their KV handles set); [B, V] float32 last-row logits."""
    handles = [_handle(s) for s in states]
    rows = [len(s.prompt_ids) for s in states]
    slots = kv.allocate(sum(rows))
    batch = kv.attention_batch(handles, rows, slots)
    tokens = torch.tensor([t for s in states for t in s.prompt_ids], dtype=torch.int64)
    tokens = tokens.to(model.device)
    out = model.forward(tokens, ragged_positions(batch), batch, kv.storage)
    last = batch.cu_rows[1:] - 1
    logits = model.logits(out.hidden, last)
    kv.append(handles, slots, rows)
    return logits


def verify_pass(
    model: LlamaModel,
    kv: KVPool,
    handles: Sequence[RequestHandle],
    roots: Tensor,  # [B] int64, each request's last emitted token
    tree: TreeBatch,
) -> tuple[Tensor, Tensor]:
    """One target forward over roots + tree rows: ([B + N, V] float32 logits, [B + N] slots)."""
    b, n = tree.batch_size, tree.num_nodes
    tokens = torch.empty(b + n, dtype=torch.int64)
    tokens[root_rows(tree)] = roots
    tokens[node_rows(tree)] = tree.token
    rows = (tree.nodes_per_request() + 1).tolist()
    slots = kv.allocate(b + n)
    batch = kv.attention_batch(handles, rows, slots, tree_row_mask(tree))
    positions = verify_positions(tree, batch.cache_len)
    out = model.forward(tokens.to(model.device), positions, batch, kv.storage)
    return model.logits(out.hidden), slots


def accept(tree: TreeBatch, logits: Tensor, states: Sequence[RequestState]) -> AcceptResult:
    """Accepted path + bonus per request from verify logits ([B + N, V] float32)."""
    if all(s.params.is_greedy for s in states):
        return greedy_accept(tree, logits.argmax(dim=-1))
    counts = (tree.nodes_per_request() + 1).tolist()
    per_row = [s.params for s, c in zip(states, counts, strict=True) for _ in range(c)]
    temperature, top_k, top_p = stack_sampling_params(per_row, logits.device)
    probs = target_probs(logits, temperature, top_k, top_p)
    sampled = torch.zeros(tree.num_nodes, dtype=torch.bool, device=logits.device)
    node_u = [torch.rand(c - 1, generator=s.generator) for s, c in zip(states, counts, strict=True)]
    bonus_u = [torch.rand(1, generator=s.generator) for s in states]
    uniforms = AcceptUniforms(
        node=torch.cat(node_u).to(logits.device), bonus=torch.cat(bonus_u).to(logits.device)
    )
    return stochastic_accept(tree, probs, sampled, None, uniforms)


def _handle(state: RequestState) -> RequestHandle:
    if state.kv is None:
        raise RuntimeError(f"request {state.request_id} has no KV handle")
    return state.kv
