"""The drafter seam: the engine asks for children of frontier nodes, one depth at a time.

Per step the engine calls :meth:`Drafter.begin_step` with each running request's context (every
committed token, the root last), then :meth:`Drafter.expand` once per drafted depth with the
nodes the policy chose to expand. Nodes are named by (request, request-local pool index), with
``ROOT`` (-1) for the root; local indices are stable for the whole step because the engine only
appends to a request's pool. The drafter answers, for every expanded node, up to ``topk`` children
as (token, draft log-prob) in descending probability; fewer (even none) is allowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class ExpandRequest:
    """Nodes to expand at one depth."""

    request: Tensor  # [M] int64, batch index of the node's request
    node: Tensor  # [M] int64, request-local pool index, ROOT (-1) for the root
    path: Sequence[Sequence[int]]  # M token paths from the root (exclusive) to the node (inclusive)
    topk: Tensor  # [M] int64, children wanted per node (>= 1)


@dataclass(frozen=True, slots=True)
class Proposals:
    """Proposals (children) for an :class:`ExpandRequest`, flattened."""

    source: Tensor  # [C] int64, index into the ExpandRequest's M nodes
    token: Tensor  # [C] int64
    logprob: Tensor  # [C] float32, log q(token | context, path), <= 0

    @classmethod
    def empty(cls, device: torch.device | str = "cpu") -> Proposals:
        """No children for any node."""
        none = torch.zeros(0, dtype=torch.int64, device=device)
        return cls(none, none, torch.zeros(0, dtype=torch.float32, device=device))


@dataclass(frozen=True, slots=True)
class TargetFeedback:
    """The target's view of the rows just committed, for drafters that read its features.

    After prefill the committed rows are each request's prompt; after a verify pass they are its
    root and its accepted nodes, in position order. ``next_token[b]`` is the token that follows
    them (the new root), whose K/V is not computed yet.
    """

    request_ids: Sequence[str]
    cu_rows: Tensor  # [B+1] int64, committed rows per request
    tokens: Tensor  # [R] int64
    positions: Tensor  # [R] int64
    hidden: Tensor  # [R, H] target's last hidden state (after the final norm), model dtype
    aux: tuple[Tensor, ...]  # [R, H] each: hidden states after the drafter's ``aux_layers``
    next_token: Tensor  # [B] int64


class Drafter(Protocol):
    """What the engine needs from any drafter (n-gram, EAGLE head, small model)."""

    name: str
    aux_layers: tuple[int, ...]  # target layers whose hidden states the drafter reads

    def observe(self, feedback: TargetFeedback) -> None:
        """Take the target's features of newly committed rows (no-op for model-free drafters)."""
        ...

    def begin_step(self, contexts: Sequence[Sequence[int]], request_ids: Sequence[str]) -> None:
        """Start a step: ``contexts[b]`` is request b's committed tokens, its root last."""
        ...

    def expand(self, nodes: ExpandRequest) -> Proposals:
        """Propose up to ``topk[m]`` children of every node ``m``, best first."""
        ...

    def release(self, request_id: str) -> None:
        """Forget a finished or cancelled request's state."""
        ...
