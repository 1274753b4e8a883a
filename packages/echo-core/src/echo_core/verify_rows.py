"""Row layout of the verify pass: one root row per request, then its draft nodes.

The target model runs one forward pass over, per request ``b``, its root (the last committed
token) followed by its ``n_b`` tree nodes, packed over the batch:

- ``cu_verify = cu_nodes + arange(B + 1)``: request ``b`` owns rows ``cu_verify[b]:cu_verify[b+1]``;
- ``root_row(b) = cu_verify[b]``;
- ``row(i) = cu_verify[b] + 1 + i_local = i + b + 1`` for packed node ``i`` of request ``b``;
- ``parent_row(i) = row(parent(i))``, or ``root_row(b)`` when ``parent(i) == ROOT``.

The logits at a row predict the token after that row's token, i.e. the row's children; so node
``i`` is judged against the target's output at ``parent_row(i)``. Example: ``cu_nodes = [0, 2, 2,
5]`` gives ``cu_verify = [0, 3, 4, 8]``, root rows ``[0, 3, 4]`` and node rows ``[1, 2, 5, 6, 7]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.tree import ROOT, TreeBatch


def verify_offsets(tree: TreeBatch) -> Tensor:
    """``cu_verify = cu_nodes + arange(B+1)``: [B+1] int64."""
    return tree.cu_nodes + torch.arange(tree.batch_size + 1, device=tree.cu_nodes.device)


def root_rows(tree: TreeBatch) -> Tensor:
    """Verify row of every request's root: [B] int64."""
    return verify_offsets(tree)[:-1]


def node_rows(tree: TreeBatch) -> Tensor:
    """Verify row of every packed node, ``i + b + 1``: [N] int64."""
    return torch.arange(tree.num_nodes, device=tree.device) + tree.request_index() + 1


def parent_rows(tree: TreeBatch) -> Tensor:
    """Verify row of every node's parent (the root row for depth 1): [N] int64."""
    req = tree.request_index()
    root = tree.cu_nodes[:-1][req] + req  # [N] root row of the node's request
    return torch.where(tree.parent == ROOT, root, root + 1 + tree.parent)
