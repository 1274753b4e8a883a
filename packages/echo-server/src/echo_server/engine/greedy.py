"""Plain greedy decoding over the runner and a KV pool: the non-speculative baseline.

A ragged batch of prompts is prefilled in one forward (no padding), then every step decodes one
token per request: each request's last token is the only new row, at position ``cache_len``.
Requests that emit an end-of-sequence id stop; the loop ends when all have stopped or produced
``max_new_tokens``. Used by the benchmark, the parity tests, and as the engine's plain policy
reference. It lives in ``engine`` (not ``model``) because it drives the KV pool: ``kv`` builds on
``model``, so ``model`` never imports ``kv``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from echo_server.kv.pool import KVPool
from echo_server.model.attention import ragged_positions
from echo_server.model.llama import LlamaModel


def greedy_generate(
    model: LlamaModel,
    pool: KVPool,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_ids: Collection[int] = (),
) -> list[list[int]]:
    """Greedy continuations of ``prompts`` (token ids), at most ``max_new_tokens`` each.

    The pool must have room for every prompt plus its continuation; slots are released at the
    end.
    """
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    handles = [pool.add_request() for _ in prompts]
    outputs: list[list[int]] = [[] for _ in prompts]
    try:
        dev = model.device
        lengths = [len(p) for p in prompts]
        tokens = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=dev)
        slots = pool.allocate(len(tokens))
        batch = pool.attention_batch(handles, lengths, slots)
        out = model.forward(tokens, ragged_positions(batch), batch, pool.storage)
        pool.append(handles, slots, lengths)
        last_rows = batch.cu_rows[1:] - 1
        next_tokens = model.logits(out.hidden, last_rows).argmax(-1)  # [B]
        active = list(range(len(prompts)))
        for _ in range(max_new_tokens):
            emitted = next_tokens.tolist()
            still: list[int] = []
            for b, tok in zip(active, emitted, strict=True):
                outputs[b].append(tok)
                if tok not in eos_ids and len(outputs[b]) < max_new_tokens:
                    still.append(b)
            if not still:
                break
            keep = [i for i, b in enumerate(active) if b in still]
            inputs = next_tokens[keep] if len(keep) < len(active) else next_tokens
            active = still
            step_handles = [handles[b] for b in active]
            ones = [1] * len(active)
            slots = pool.allocate(len(active))
            batch = pool.attention_batch(step_handles, ones, slots)
            out = model.forward(inputs, batch.cache_len, batch, pool.storage)
            pool.append(step_handles, slots, ones)
            next_tokens = model.logits(out.hidden).argmax(-1)
    finally:
        for h in handles:
            pool.release_request(h)
    return outputs
