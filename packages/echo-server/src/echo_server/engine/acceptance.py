"""Step phase 4 (accept): a path per request from the verify logits, through echo-kernels.

All-greedy batches use the greedy rule on the argmax; otherwise every row's target
distribution comes from its request's temperature / top-k / top-p (temperature 0 rows become
one-hot, for which the stochastic rule reduces to the greedy one), drafted candidates count as
deterministic (top-k) candidates, and each request draws its uniforms from its own seeded
generator, so a seeded request's output does not depend on what else is in the batch.

The rules are echo-core's (:mod:`echo_core.acceptance`, :mod:`echo_core.acceptance_stochastic`);
they run through echo-kernels' backend dispatch on the logits' device: echo-core's reference for
CPU logits, echo-kernels' Triton kernels for CUDA logits (when triton is installed). The tree is
moved to the logits for the call and the result comes back on the tree's device, where the
engine's commit and emit steps read it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from echo_core.acceptance import AcceptResult
from echo_core.acceptance_stochastic import AcceptUniforms
from echo_core.sampling import stack_sampling_params, target_probs
from echo_core.tree import TreeBatch
from echo_kernels import Backend, greedy_accept, stochastic_accept
from echo_server.engine.request import RequestState


def accept(
    tree: TreeBatch,
    logits: Tensor,  # [B + N, V] float32, verify rows
    states: Sequence[RequestState],
    *,
    backend: Backend = "auto",
) -> AcceptResult:
    """Accepted path + bonus per request from verify logits (module docstring)."""
    dev = logits.device
    rows = tree.to(dev)
    if all(s.params.is_greedy for s in states):
        result = greedy_accept(rows, logits.argmax(dim=-1), backend=backend)
    else:
        counts = (tree.nodes_per_request() + 1).tolist()
        per_row = [s.params for s, c in zip(states, counts, strict=True) for _ in range(c)]
        temperature, top_k, top_p = stack_sampling_params(per_row, dev)
        probs = target_probs(logits, temperature, top_k, top_p).contiguous()
        sampled = torch.zeros(tree.num_nodes, dtype=torch.bool, device=dev)
        node_u = [
            torch.rand(c - 1, generator=s.generator) for s, c in zip(states, counts, strict=True)
        ]
        bonus_u = [torch.rand(1, generator=s.generator) for s in states]
        uniforms = AcceptUniforms(node=torch.cat(node_u).to(dev), bonus=torch.cat(bonus_u).to(dev))
        result = stochastic_accept(rows, probs, sampled, None, uniforms, backend=backend)
    if result.num_accepted.device == tree.device:
        return result
    return AcceptResult(
        result.accepted_nodes.to(tree.device),
        result.num_accepted.to(tree.device),
        result.bonus_token.to(tree.device),
    )


def first_token(state: RequestState, logits: Tensor) -> int:
    """First output token from the prompt's last-row logits ([V] float32): the bonus token of a
    tree with no draft nodes, sampled from the request's own generator."""
    p = state.params
    if p.is_greedy:
        return int(logits.argmax())
    probs = target_probs(
        logits.unsqueeze(0),
        torch.tensor([p.temperature]),
        torch.tensor([p.top_k]),
        torch.tensor([p.top_p]),
    )
    return int(torch.multinomial(probs[0], 1, generator=state.generator))
