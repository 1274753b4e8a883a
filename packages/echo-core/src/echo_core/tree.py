"""Packed ragged draft trees: the candidate pool a drafter produces, the SuperTree a policy keeps.

Both are one flat set of nodes for the whole batch, split per request by ``cu_nodes``
offsets (``cu_nodes[b]:cu_nodes[b+1]`` are request b's nodes). Per node:

- ``token``: the drafted token id;
- ``parent``: request-local index of the parent node, ``ROOT`` (-1) for children of the root
  (the root is the request's last committed token, verified but never counted as a draft node);
- ``depth``: 1 for children of the root, ``depth[parent] + 1`` otherwise;
- ``draft_logprob``: log q(token | ancestors) under the drafter;
- ``path_logprob``: sum of draft log-probs from the root, i.e. log of the path score
  ``prod_{a in path} q(a)``.

Invariants (checked by :meth:`TreeBatch.validate`): parents precede children within a request,
depths are consistent, ``path_logprob[i] = path_logprob[parent] + draft_logprob[i]``.
A request with zero draft nodes is legal: it decodes one token, like plain decoding.

Tensors live on the CPU or one device together; indices are int64, scores float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.errors import TreeError

ROOT = -1
"""Parent index of the children of a request's root."""

PATH_ATOL = 1e-4
"""Absolute tolerance of the path log-prob consistency check (float32 sums)."""


@dataclass(frozen=True, slots=True)
class TreeBatch:
    """A packed batch of draft trees (see the module docstring for the fields)."""

    cu_nodes: Tensor  # [B+1] int64, cu_nodes[0] == 0, non-decreasing
    token: Tensor  # [N] int64
    parent: Tensor  # [N] int64, request-local, ROOT for depth 1
    depth: Tensor  # [N] int64, >= 1
    draft_logprob: Tensor  # [N] float32, <= 0
    path_logprob: Tensor  # [N] float32, <= 0

    @property
    def batch_size(self) -> int:
        return int(self.cu_nodes.numel()) - 1

    @property
    def num_nodes(self) -> int:
        return int(self.token.numel())

    @property
    def device(self) -> torch.device:
        return self.token.device

    def to(self, device: torch.device | str) -> TreeBatch:
        """This batch with every tensor on ``device`` (itself when already there)."""
        if self.device == torch.device(device):
            return self
        return TreeBatch(
            cu_nodes=self.cu_nodes.to(device),
            token=self.token.to(device),
            parent=self.parent.to(device),
            depth=self.depth.to(device),
            draft_logprob=self.draft_logprob.to(device),
            path_logprob=self.path_logprob.to(device),
        )

    def nodes_per_request(self) -> Tensor:
        """``n_b = cu_nodes[b+1] - cu_nodes[b]``: [B] int64."""
        return self.cu_nodes[1:] - self.cu_nodes[:-1]

    def request_index(self) -> Tensor:
        """Request of every node: [N] int64 (``output_size`` spares CUDA a host sync)."""
        counts = self.nodes_per_request()
        rows = torch.arange(self.batch_size, device=self.device)
        return torch.repeat_interleave(rows, counts, output_size=self.num_nodes)

    def global_parent(self) -> Tensor:
        """Parent as an index into the packed node arrays, ROOT kept: [N] int64."""
        offsets = self.cu_nodes[:-1][self.request_index()]
        return torch.where(self.parent >= 0, self.parent + offsets, self.parent)

    def request(self, b: int) -> TreeBatch:
        """Request ``b`` alone, as a batch of one."""
        if not 0 <= b < self.batch_size:
            raise TreeError(f"request index {b} out of range for batch of {self.batch_size}")
        lo, hi = int(self.cu_nodes[b]), int(self.cu_nodes[b + 1])
        return TreeBatch(
            cu_nodes=torch.tensor([0, hi - lo], dtype=torch.int64, device=self.device),
            token=self.token[lo:hi],
            parent=self.parent[lo:hi],
            depth=self.depth[lo:hi],
            draft_logprob=self.draft_logprob[lo:hi],
            path_logprob=self.path_logprob[lo:hi],
        )

    def max_depth(self) -> int:
        return int(self.depth.max()) if self.num_nodes else 0

    def validate(self) -> None:
        """Check every invariant; raise :class:`TreeError` naming the first violation."""
        validate_tree(self)


def validate_tree(tree: TreeBatch) -> None:
    """Raise :class:`TreeError` unless ``tree`` satisfies the packed-tree invariants."""
    cu = tree.cu_nodes
    if cu.dim() != 1 or cu.numel() < 1 or cu.dtype != torch.int64:
        raise TreeError(
            f"cu_nodes must be a 1-D int64 tensor of B+1 offsets, got {tuple(cu.shape)} {cu.dtype}"
        )
    if int(cu[0]) != 0:
        raise TreeError(f"cu_nodes[0] must be 0, got {int(cu[0])}")
    if cu.numel() > 1 and bool((cu[1:] < cu[:-1]).any()):
        raise TreeError(f"cu_nodes must be non-decreasing, got {cu.tolist()}")
    n = tree.num_nodes
    if int(cu[-1]) != n:
        raise TreeError(f"cu_nodes[-1]={int(cu[-1])} but there are {n} nodes")
    for name in ("token", "parent", "depth", "draft_logprob", "path_logprob"):
        t: Tensor = getattr(tree, name)
        if t.dim() != 1 or t.numel() != n:
            raise TreeError(f"{name} must be 1-D with {n} entries, got shape {tuple(t.shape)}")
        if t.device != tree.device:
            raise TreeError(f"{name} is on {t.device}, token on {tree.device}")
    for name in ("token", "parent", "depth"):
        if getattr(tree, name).dtype != torch.int64:
            raise TreeError(f"{name} must be int64, got {getattr(tree, name).dtype}")
    if n == 0:
        return
    if bool((tree.token < 0).any()):
        raise TreeError("token ids must be non-negative")
    local = torch.arange(n, device=tree.device) - cu[:-1][tree.request_index()]
    bad = (tree.parent < ROOT) | (tree.parent >= local)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise TreeError(
            f"node {i} (request-local {int(local[i])}) has parent {int(tree.parent[i])}: "
            "parents must precede their children within a request"
        )
    gp = tree.global_parent()
    has_parent = gp >= 0
    expected_depth = torch.ones_like(tree.depth)
    expected_depth[has_parent] = tree.depth[gp[has_parent]] + 1
    bad = tree.depth != expected_depth
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise TreeError(
            f"node {i} has depth {int(tree.depth[i])}, expected {int(expected_depth[i])}"
        )
    expected_path = tree.draft_logprob.clone()
    expected_path[has_parent] += tree.path_logprob[gp[has_parent]]
    bad = (tree.path_logprob - expected_path).abs() > PATH_ATOL
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise TreeError(
            f"node {i} has path_logprob {float(tree.path_logprob[i]):.6f}, expected "
            f"parent path + draft log-prob = {float(expected_path[i]):.6f}"
        )


def make_tree(
    nodes_per_request: list[list[tuple[int, int, float]]],
    device: torch.device | str = "cpu",
) -> TreeBatch:
    """Build and validate a batch from per-request ``(token, parent, draft_logprob)`` lists.

    A convenience for tests, examples and drafters that build trees node by node; depths and
    path log-probs are derived. Example: ``make_tree([[(5, -1, -0.1), (7, 0, -0.2)], []])`` is a
    chain of two nodes for request 0 and an empty tree for request 1.
    """
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    draft: list[float] = []
    paths: list[float] = []
    cu = [0]
    for req in nodes_per_request:
        base = len(tokens)
        for i, (tok, par, lp) in enumerate(req):
            if not ROOT <= par < i:
                raise TreeError(f"node {i}: parent {par} must be -1 or an earlier node")
            tokens.append(tok)
            parents.append(par)
            depths.append(1 if par == ROOT else depths[base + par] + 1)
            draft.append(lp)
            paths.append(lp if par == ROOT else paths[base + par] + lp)
        cu.append(len(tokens))
    tree = TreeBatch(
        cu_nodes=torch.tensor(cu, dtype=torch.int64, device=device),
        token=torch.tensor(tokens, dtype=torch.int64, device=device),
        parent=torch.tensor(parents, dtype=torch.int64, device=device),
        depth=torch.tensor(depths, dtype=torch.int64, device=device),
        draft_logprob=torch.tensor(draft, dtype=torch.float32, device=device),
        path_logprob=torch.tensor(paths, dtype=torch.float32, device=device),
    )
    tree.validate()
    return tree


def empty_tree(batch_size: int, device: torch.device | str = "cpu") -> TreeBatch:
    """A batch of ``batch_size`` requests with no draft nodes (plain decoding)."""
    if batch_size < 0:
        raise TreeError(f"batch_size must be >= 0, got {batch_size}")
    i64 = torch.zeros(0, dtype=torch.int64, device=device)
    f32 = torch.zeros(0, dtype=torch.float32, device=device)
    return TreeBatch(
        cu_nodes=torch.zeros(batch_size + 1, dtype=torch.int64, device=device),
        token=i64,
        parent=i64.clone(),
        depth=i64.clone(),
        draft_logprob=f32,
        path_logprob=f32.clone(),
    )


def select_nodes(pool: TreeBatch, keep: Tensor) -> TreeBatch:
    """The sub-tree batch of the nodes where ``keep`` ([N] bool) is true.

    The selection must be ancestor-closed (a kept node's parent is kept); parents are re-indexed
    to the compacted request-local positions and node order is preserved, so the result is again
    a valid :class:`TreeBatch`. This is how a policy's choice becomes a SuperTree.
    """
    if keep.dtype != torch.bool or keep.shape != pool.token.shape:
        raise TreeError(
            f"keep must be a [N={pool.num_nodes}] bool mask, got {tuple(keep.shape)} {keep.dtype}"
        )
    gp = pool.global_parent()
    orphan = keep & (gp >= 0) & ~keep[gp.clamp(min=0)]
    if bool(orphan.any()):
        i = int(orphan.nonzero()[0])
        raise TreeError(
            f"selection is not ancestor-closed: node {i} is kept but its parent {int(gp[i])} is not"
        )
    req = pool.request_index()
    counts = torch.zeros(pool.batch_size, dtype=torch.int64, device=pool.device)
    counts.index_add_(0, req, keep.to(torch.int64))
    cu = torch.zeros(pool.batch_size + 1, dtype=torch.int64, device=pool.device)
    cu[1:] = torch.cumsum(counts, 0)
    kept = keep.nonzero().squeeze(1)  # the one host sync of the selection: its size
    # new global index of each kept node, then request-local parent = new(gp) - new start.
    new_global = torch.cumsum(keep.to(torch.int64), 0) - 1
    kept_gp = gp[kept]
    kept_req = req[kept]
    new_parent = torch.where(
        kept_gp >= 0, new_global[kept_gp.clamp(min=0)] - cu[:-1][kept_req], kept_gp
    )
    return TreeBatch(
        cu_nodes=cu,
        token=pool.token[kept],
        parent=new_parent,
        depth=pool.depth[kept],
        draft_logprob=pool.draft_logprob[kept],
        path_logprob=pool.path_logprob[kept],
    )


CandidatePool = TreeBatch
"""What a drafter produced this step (every drafted node)."""

SuperTree = TreeBatch
"""What the policy selected for verification (an ancestor-closed subset of the pool)."""
