"""Acceptance results and the greedy (temperature 0) tree acceptance rule.

Rows follow :mod:`echo_core.verify_rows`: ``a[r]`` is the target's argmax at verify row ``r``,
which predicts the children of the row's token.

Greedy rule, per request ``b``:

- ``match(i) = token(i) == a[parent_row(i)]``;
- ``ok(i) = match(i) and (parent(i) == ROOT or ok(parent(i)))`` (the whole root-to-``i`` path
  matches);
- the accepted leaf is ``i* = argmax_i (depth(i), -i) over {i : ok(i)}``: the deepest fully
  matching node, the first in node order among equally deep ones (so of two matching siblings
  with the same token, the first wins when their subtrees reach the same depth);
- accepted path = the root-to-``i*`` path; ``bonus = a[row(i*)]``, or ``a[root_row(b)]`` when no
  node is ok (in particular for a request with zero draft nodes, which decodes like plain
  greedy decoding).

Example: root argmax 5, nodes ``[(5, ROOT), (6, ROOT), (7, 0)]`` with argmax 7 at node 0's row
and 9 at node 2's row: nodes 0 and 2 are accepted and the request emits ``[5, 7, 9]``.

The stochastic rule lives in :mod:`echo_core.acceptance_stochastic`; both return
:class:`AcceptResult`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.errors import AcceptanceError
from echo_core.tree import TreeBatch
from echo_core.verify_rows import node_rows, parent_rows, root_rows

PAD_NODE = -1
"""Padding of :attr:`AcceptResult.accepted_nodes` beyond a request's accepted length."""


@dataclass(frozen=True, slots=True)
class AcceptResult:
    """Per request: the accepted root-to-node path and the bonus token that follows it."""

    accepted_nodes: Tensor  # [B, L] int64, request-local node ids in depth order, PAD_NODE after
    num_accepted: Tensor  # [B] int64, 0 <= num_accepted <= L
    bonus_token: Tensor  # [B] int64

    def __post_init__(self) -> None:
        b = self.num_accepted.shape[0] if self.num_accepted.dim() == 1 else -1
        if self.accepted_nodes.dim() != 2 or self.accepted_nodes.shape[0] != b:
            raise AcceptanceError(
                f"accepted_nodes must be [B, L] with B = {b}, "
                f"got {tuple(self.accepted_nodes.shape)}"
            )
        if self.bonus_token.shape != (b,):
            raise AcceptanceError(f"bonus_token must be [{b}], got {tuple(self.bonus_token.shape)}")
        for name in ("accepted_nodes", "num_accepted", "bonus_token"):
            t: Tensor = getattr(self, name)
            if t.dtype != torch.int64:
                raise AcceptanceError(f"{name} must be int64, got {t.dtype}")

    @property
    def batch_size(self) -> int:
        return int(self.num_accepted.shape[0])

    def accepted_tokens(self, tree: TreeBatch) -> Tensor:
        """Tokens of the accepted nodes, PAD_NODE-padded like ``accepted_nodes``: [B, L] int64."""
        valid = self.accepted_nodes != PAD_NODE
        packed = self.accepted_nodes + tree.cu_nodes[:-1, None]
        tokens = tree.token[torch.where(valid, packed, 0)] if tree.num_nodes else packed
        return torch.where(valid, tokens, PAD_NODE)

    def emitted_tokens(self, tree: TreeBatch) -> list[list[int]]:
        """Per request, the accepted tokens followed by the bonus token (host lists)."""
        tokens = self.accepted_tokens(tree).tolist()
        counts = self.num_accepted.tolist()
        bonus = self.bonus_token.tolist()
        return [[*row[:n], t] for row, n, t in zip(tokens, counts, bonus, strict=True)]


def result_from_leaf(
    tree: TreeBatch,
    leaf: Tensor,  # [B] int64, packed id of the last accepted node, -1 when none
    bonus: Tensor,  # [B] int64
) -> AcceptResult:
    """The result whose accepted path is the root-to-``leaf`` path of every request."""
    length = torch.zeros_like(leaf)  # [B] int64, the leaf's depth
    if tree.num_nodes:
        length = torch.where(leaf >= 0, tree.depth[leaf.clamp(min=0)], length)
    width = int(length.max()) if tree.batch_size else 0
    nodes = torch.full((tree.batch_size, width), PAD_NODE, dtype=torch.int64, device=tree.device)
    if width:
        gp = tree.global_parent()
        req = torch.arange(tree.batch_size, device=tree.device)
        cur = leaf.clone()
        for _ in range(width):  # walk leaf -> root, one level per iteration
            live = cur >= 0
            c = cur[live]
            nodes[req[live], tree.depth[c] - 1] = c - tree.cu_nodes[:-1][live]
            cur[live] = gp[c]
    return AcceptResult(accepted_nodes=nodes, num_accepted=length, bonus_token=bonus)


def greedy_accept(
    tree: TreeBatch,
    target_argmax: Tensor,  # [B+N] int64, target argmax per verify row
) -> AcceptResult:
    """Accept the deepest fully matching root-to-node path per request (module docstring)."""
    b, n = tree.batch_size, tree.num_nodes
    if target_argmax.shape != (b + n,) or target_argmax.dtype != torch.int64:
        raise AcceptanceError(
            f"target_argmax must be [B+N] = [{b + n}] int64, "
            f"got {tuple(target_argmax.shape)} {target_argmax.dtype}"
        )
    if target_argmax.device != tree.device:
        raise AcceptanceError(f"target_argmax is on {target_argmax.device}, tree on {tree.device}")
    ok = tree.token == target_argmax[parent_rows(tree)]  # [N] bool, match(i) for now
    gp = tree.global_parent()
    for d in range(2, tree.max_depth() + 1):  # parents are final before their children
        at = (tree.depth == d).nonzero().squeeze(1)
        ok[at] &= ok[gp[at]]
    # Key (depth, -local index) packed in one int64 so one segment max picks the leaf.
    local = torch.arange(n, device=tree.device) - tree.cu_nodes[:-1][tree.request_index()]
    key = torch.where(ok, tree.depth * (n + 1) + (n - local), 0)
    best = torch.zeros(b, dtype=torch.int64, device=tree.device)
    best.scatter_reduce_(0, tree.request_index(), key, reduce="amax")
    leaf = torch.where(best > 0, n - best % (n + 1) + tree.cu_nodes[:-1], -1)
    rows = root_rows(tree)
    if n:
        rows = torch.where(leaf >= 0, node_rows(tree)[leaf.clamp(min=0)], rows)
    return result_from_leaf(tree, leaf, target_argmax[rows])
