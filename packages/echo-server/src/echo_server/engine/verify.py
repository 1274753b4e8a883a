"""Step phases 2-3 (allocate, verify) and prefill: target forwards over packed ragged rows, and
the drafter feedback.

Prefill runs a chunk of each prefilling request's prompt (by default all of it) as causal rows
after the prompt rows already cached, and keeps all of their K/V; the logits of a prompt's last
row give its first output token (engine/chunking.py decides the chunks).

Verify runs, per request, its root (last emitted token) then its tree nodes, at positions
``cache_len + depth`` with the tree mask (root + ancestors-or-self visible, plus the cached
prefix). Every row's K/V is written into freshly allocated slots; commit keeps the accepted.
Acceptance (phase 4) is :mod:`echo_server.engine.acceptance`.

``PassOutput.forward_s`` is the wall time of the target model alone in a verify pass
(``model.forward`` + ``model.logits`` over its rows), on a CPU model only: elsewhere the forward
is asynchronous, and timing it would need a device sync the engine does not otherwise make, so
it is None. It is the denominator of the bench's ``step_over_forward`` (what a decode step costs
beyond the model over the same rows). On CUDA ``PassOutput.forward_events`` holds two events
recorded around the same calls, read later without a sync (engine/pass_timing.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.layouts import verify_positions
from echo_core.tree import TreeBatch
from echo_core.verify_rows import node_rows, root_rows
from echo_server.drafting.base import TargetFeedback
from echo_server.engine.pass_timing import EventPair, start_events, stop_events
from echo_server.engine.request import RequestState
from echo_server.kv.pool import KVPool, RequestHandle
from echo_server.model.attention import ragged_positions, tree_row_mask
from echo_server.model.llama import LlamaModel


@dataclass(frozen=True, slots=True)
class PassOutput:
    """One target forward over packed rows (prefill or verify)."""

    logits: Tensor  # [B, V] float32 (prefill: last prompt row) or [B + N, V] (verify: all rows)
    tokens: Tensor  # [R] int64
    positions: Tensor  # [R] int64
    cu_rows: Tensor  # [B + 1] int64
    hidden: Tensor  # [R, H] final hidden states
    aux: tuple[Tensor, ...]  # [R, H] each, hidden states after the requested aux layers
    slots: Tensor  # [R] int64, KV slot written for every row
    forward_s: float | None = None  # verify: model forward + logits wall time (CPU only)
    forward_events: EventPair | None = None  # verify on CUDA: events around the same calls


def prefill(
    model: LlamaModel,
    kv: KVPool,
    states: Sequence[RequestState],
    aux_layers: Sequence[int] = (),
    rows: Sequence[int] | None = None,
) -> PassOutput:
    """Prefill the next ``rows[b]`` prompt tokens of ``states[b]`` (their KV handles set; None:
    the whole rest of each prompt) after what each has cached, and keep all their K/V.

    ``logits[b]`` is the distribution after request b's last row run here: its first output
    token when the chunk ends the prompt.
    """
    handles = [kv_handle(s) for s in states]
    starts = [kv.cache_len(h) for h in handles]
    if rows is None:
        rows = [len(s.prompt_ids) - c for s, c in zip(states, starts, strict=True)]
    if len(rows) != len(states) or any(
        n < 1 or c + n > len(s.prompt_ids) for s, c, n in zip(states, starts, rows, strict=True)
    ):
        raise ValueError(
            f"prefill chunks {list(rows)} do not fit prompts of "
            f"{[len(s.prompt_ids) for s in states]} tokens with {starts} cached"
        )
    slots = kv.allocate(sum(rows))
    try:
        batch = kv.attention_batch(handles, rows, slots)
        prompt = [
            t for s, c, n in zip(states, starts, rows, strict=True) for t in s.prompt_ids[c : c + n]
        ]
        tokens = torch.tensor(prompt, dtype=torch.int64, device=model.device)
        positions = ragged_positions(batch)
        out = model.forward(tokens, positions, batch, kv.storage, aux_layers)
        logits = model.logits(out.hidden, batch.cu_rows[1:] - 1)
    except BaseException:
        kv.free(slots)  # nothing was committed: the slots go back
        raise
    kv.append(handles, slots, rows)
    return PassOutput(logits, tokens, positions, batch.cu_rows, out.hidden, out.aux, slots)


def verify_pass(
    model: LlamaModel,
    kv: KVPool,
    handles: Sequence[RequestHandle],
    roots: Tensor,  # [B] int64, each request's last emitted token
    tree: TreeBatch,
    aux_layers: Sequence[int] = (),
) -> PassOutput:
    """One target forward over every request's root + tree rows (K/V written, not committed)."""
    b, n = tree.batch_size, tree.num_nodes
    tokens = torch.empty(b + n, dtype=torch.int64, device=model.device)
    tokens[root_rows(tree)] = roots
    tokens[node_rows(tree)] = tree.token
    rows = (tree.nodes_per_request() + 1).tolist()
    slots = kv.allocate(b + n)
    try:
        batch = kv.attention_batch(handles, rows, slots, tree_row_mask(tree))
        positions = verify_positions(tree, batch.cache_len)
        tokens = tokens.to(model.device)
        events, start = start_events(model.device), time.perf_counter()
        out = model.forward(tokens, positions, batch, kv.storage, aux_layers)
        logits = model.logits(out.hidden)
        forward_s = time.perf_counter() - start if model.device.type == "cpu" else None
        stop_events(events)
    except BaseException:
        kv.free(slots)  # nothing was committed: the slots go back
        raise
    return PassOutput(
        logits, tokens, positions, batch.cu_rows, out.hidden, out.aux, slots, forward_s, events
    )


def feedback(
    request_ids: Sequence[str], out: PassOutput, keep: Tensor | None, next_token: Tensor
) -> TargetFeedback:
    """The committed rows of a pass (``keep`` [R] bool; None = all) for the drafter."""
    if keep is None:
        cu = out.cu_rows
        return TargetFeedback(
            request_ids, cu, out.tokens, out.positions, out.hidden, out.aux, next_token
        )
    per_row = torch.repeat_interleave(
        torch.arange(len(request_ids), device=keep.device), torch.diff(out.cu_rows)
    )
    counts = torch.bincount(per_row[keep], minlength=len(request_ids))
    cu = torch.zeros(len(request_ids) + 1, dtype=torch.int64, device=keep.device)
    cu[1:] = torch.cumsum(counts, 0)
    return TargetFeedback(
        request_ids,
        cu,
        out.tokens[keep],
        out.positions[keep],
        out.hidden[keep],
        tuple(a[keep] for a in out.aux),
        next_token,
    )


def kv_handle(state: RequestState) -> RequestHandle:
    """The KV handle of an admitted request; RuntimeError if it has none."""
    if state.kv is None:
        raise RuntimeError(f"request {state.request_id} has no KV handle")
    return state.kv
