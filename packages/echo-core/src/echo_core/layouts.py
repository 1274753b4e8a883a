"""Derived views of a packed tree batch: positions, ancestor masks, EAGLE and SGLang layouts.

Verify rows (:mod:`echo_core.verify_rows`): the target verifies, per request b, its root (the
last committed token, whose KV is not cached yet) followed by its ``n_b`` nodes, packed with offsets
``cu_verify = cu_nodes + arange(B + 1)`` (row ``cu_verify[b]`` is the root, row
``cu_verify[b] + 1 + i`` is request-local node ``i``).

Positions: with ``cache_len[b]`` tokens already in request b's KV cache, the root sits at position
``cache_len[b]`` and node i at ``cache_len[b] + depth[i]`` (siblings share a position).

Ancestor mask: ``A[i, j] = 1`` iff request-local node j is node i or one of its ancestors. In the
bit-packed form, word ``w`` of node i holds bits ``j - 32 w`` for ``j`` in ``[32 w, 32 w + 32)``
(int32 words, two's complement for bit 31). Every node also attends to the root and the cached
prefix; those columns are not stored.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.errors import TreeError
from echo_core.tree import ROOT, TreeBatch, make_tree
from echo_core.verify_rows import node_rows, verify_offsets

BITS_PER_WORD = 32
NO_INDEX = -1
"""Padding / "none" marker in index layouts (EAGLE retrieve indices, SGLang next pointers)."""


def verify_positions(tree: TreeBatch, cache_len: Tensor) -> Tensor:
    """Position of every verify row: root ``cache_len[b]``, node ``cache_len[b] + depth``.

    cache_len: [B] int64. Returns [B + N] int64 in verify-row order.
    """
    if cache_len.shape != (tree.batch_size,):
        raise TreeError(
            f"cache_len must have shape [{tree.batch_size}], got {tuple(cache_len.shape)}"
        )
    pos = torch.empty(tree.batch_size + tree.num_nodes, dtype=torch.int64, device=tree.device)
    pos[verify_offsets(tree)[:-1]] = cache_len.to(torch.int64)
    pos[node_rows(tree)] = cache_len.to(torch.int64)[tree.request_index()] + tree.depth
    return pos


def max_nodes(tree: TreeBatch) -> int:
    """Largest per-request node count (0 for an empty batch)."""
    return int(tree.nodes_per_request().max()) if tree.batch_size else 0


def ancestor_mask(tree: TreeBatch) -> Tensor:
    """Dense ancestor-or-self mask: [N, max_nodes] bool, column j = request-local node j.

    Built by walking every node up at once: ``a_0(i) = i``, ``a_{k+1}(i) = parent(a_k(i))``, and
    ``A[i, local(a_k(i))] = 1`` while ``a_k(i)`` is a node; O(max depth) tensor operations and no
    host syncs beyond ``max_nodes`` and ``max_depth``. Finished walks write into a spare column
    ``max_nodes``, dropped at the end.
    """
    n, width = tree.num_nodes, max_nodes(tree)
    dev = tree.device
    mask = torch.zeros(n, width + 1, dtype=torch.bool, device=dev)
    if n == 0:
        return mask[:, :width]
    rows = torch.arange(n, device=dev)
    local = rows - tree.cu_nodes[:-1][tree.request_index()]
    gp = tree.global_parent()
    cur = rows  # a_k(i), ROOT once the walk has left the tree
    for _ in range(tree.max_depth()):
        inside = cur >= 0
        at = cur.clamp(min=0)
        mask[rows, torch.where(inside, local[at], width)] = True
        cur = torch.where(inside, gp[at], cur)
    return mask[:, :width]


def pack_bits(mask: Tensor) -> Tensor:
    """Pack a [N, M] bool mask into [N, ceil(M / 32)] int32 words (at least one word)."""
    n, m = mask.shape
    words = max(1, -(-m // BITS_PER_WORD))
    padded = torch.zeros(n, words * BITS_PER_WORD, dtype=torch.int64, device=mask.device)
    padded[:, :m] = mask.to(torch.int64)
    weights = torch.ones(BITS_PER_WORD, dtype=torch.int64, device=mask.device) << torch.arange(
        BITS_PER_WORD, device=mask.device
    )
    packed = (padded.view(n, words, BITS_PER_WORD) * weights).sum(-1)
    # Values >= 2**31 wrap to negative int32: the bit pattern is what matters.
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_bits(words: Tensor, width: int) -> Tensor:
    """Inverse of :func:`pack_bits`: [N, W] int32 -> [N, width] bool."""
    shifts = torch.arange(BITS_PER_WORD, device=words.device, dtype=torch.int64)
    bits = (words.to(torch.int64).unsqueeze(-1) >> shifts) & 1
    return bits.reshape(words.shape[0], words.shape[1] * BITS_PER_WORD)[:, :width].to(torch.bool)


def ancestor_bits(tree: TreeBatch) -> Tensor:
    """Bit-packed ancestor-or-self mask: [N, ceil(max_nodes / 32)] int32 (module docstring)."""
    return pack_bits(ancestor_mask(tree))


def retrieve_indices(tree: TreeBatch, b: int) -> Tensor:
    """EAGLE retrieve indices of request b: [num_leaves, max_depth + 1] int64.

    Each row is one root-to-leaf path as local verify rows (0 = root, ``i + 1`` = node i), padded
    with -1. Leaves are ordered by node index. A request without nodes has one row ``[0]``.
    """
    req = tree.request(b)
    n = req.num_nodes
    parent = req.parent.tolist()
    has_child = [False] * n
    for p in parent:
        if p != ROOT:
            has_child[p] = True
    paths: list[list[int]] = []
    for leaf in (i for i in range(n) if not has_child[i]):
        path = [leaf + 1]
        while parent[path[-1] - 1] != ROOT:
            path.append(parent[path[-1] - 1] + 1)
        paths.append([0, *reversed(path)])
    if not paths:
        paths = [[0]]
    width = max(len(p) for p in paths)
    out = torch.full((len(paths), width), NO_INDEX, dtype=torch.int64)
    for r, p in enumerate(paths):
        out[r, : len(p)] = torch.tensor(p, dtype=torch.int64)
    return out.to(tree.device)


def tree_from_retrieve_indices(
    tokens: Tensor, retrieve: Tensor, draft_logprob: Tensor | None = None
) -> TreeBatch:
    """Rebuild a one-request tree from EAGLE retrieve indices.

    tokens: [n + 1] int64 verify tokens (root first). retrieve: [L, D + 1] int64 as returned by
    :func:`retrieve_indices`. draft_logprob: [n] float32 or None (zeros).
    """
    n = tokens.numel() - 1
    parent = torch.full((n,), -2, dtype=torch.int64)
    for row in retrieve.tolist():
        path = [r for r in row if r != NO_INDEX]
        for prev, cur in itertools.pairwise(path):
            parent[cur - 1] = prev - 1  # root row 0 -> ROOT
    if bool((parent == -2).any()):
        raise TreeError("retrieve indices do not cover every node")
    lp = [0.0] * n if draft_logprob is None else draft_logprob.tolist()
    nodes = [
        (int(tok), int(par), float(x))
        for tok, par, x in zip(tokens[1:].tolist(), parent.tolist(), lp, strict=True)
    ]
    return make_tree([nodes], device=tokens.device)


@dataclass(frozen=True, slots=True)
class SGLangVerifyLayout:
    """SGLang's EAGLE verify encoding, padded to ``T`` draft tokens per request (root first).

    Local index 0 is the root, ``i + 1`` is node i. Padding slots hold token 0 and -1 pointers;
    they are isolated (attend to nothing but themselves) and can never be accepted.
    """

    draft_token: Tensor  # [B * T] int64, root first per request
    positions: Tensor  # [B * T] int64
    retrive_index: Tensor  # [B, T] int64, flat row b * T + j (padding slots too, as SGLang)
    retrive_next_token: Tensor  # [B, T] int64, first child (local), -1 if none
    retrive_next_sibling: Tensor  # [B, T] int64, next sibling (local), -1 if none
    tree_mask: Tensor  # [B, T, T] bool, ancestor-or-self incl. root column
    num_tokens: Tensor  # [B] int64, n_b + 1 real tokens per request


def _next_pointers(
    parent_flat: Tensor,  # [N] int64, flat slot b * T + parent_slot of every node's parent
    slot: Tensor,  # [N] int64, flat slot b * T + local + 1 of every node
    me: Tensor,  # [N] int64, local slot (local + 1) of every node
    b_size: int,
    t: int,
) -> tuple[Tensor, Tensor]:
    """First-child and next-sibling pointers, [B, T] int64 each (local slots, NO_INDEX = none).

    Children are ordered by node index: ``next_token[p]`` is the smallest child slot of p (a
    scatter-min), and ``next_sibling[c]`` the next node after c, in node order, under the same
    parent (neighbours in a stable sort by parent). Tensor ops only, no host syncs.
    """
    dev = parent_flat.device
    first = torch.full((b_size * t,), t, dtype=torch.int64, device=dev)  # t: no child yet
    first.scatter_reduce_(0, parent_flat, me, reduce="amin")
    next_token = torch.where(first == t, NO_INDEX, first).view(b_size, t)
    order = torch.sort(parent_flat, stable=True).indices
    same = parent_flat[order[1:]] == parent_flat[order[:-1]]
    sibling = torch.full((b_size * t,), NO_INDEX, dtype=torch.int64, device=dev)
    sibling[slot[order[:-1]]] = torch.where(same, me[order[1:]], NO_INDEX)
    return next_token, sibling.view(b_size, t)


def to_sglang(
    tree: TreeBatch, root_token: Tensor, cache_len: Tensor, num_draft_tokens: int | None = None
) -> SGLangVerifyLayout:
    """Encode a tree batch in SGLang's padded verify layout.

    root_token, cache_len: [B] int64. ``num_draft_tokens`` (T, root included) defaults to
    ``max_nodes + 1``; a request with more nodes than ``T - 1`` raises.
    """
    b_size = tree.batch_size
    t = max_nodes(tree) + 1 if num_draft_tokens is None else num_draft_tokens
    counts = tree.nodes_per_request()
    if b_size and int(counts.max()) + 1 > t:
        raise TreeError(
            f"num_draft_tokens={t} is smaller than the largest tree ({int(counts.max())} + root)"
        )
    dev = tree.device
    req = tree.request_index()
    local = torch.arange(tree.num_nodes, device=dev) - tree.cu_nodes[:-1][req]
    slot = req * t + local + 1  # flat slot of each node
    draft = torch.zeros(b_size * t, dtype=torch.int64, device=dev)
    draft[torch.arange(b_size, device=dev) * t] = root_token.to(torch.int64)
    draft[slot] = tree.token
    pos = torch.zeros(b_size * t, dtype=torch.int64, device=dev)
    pos.view(b_size, t)[:] = cache_len.to(torch.int64).unsqueeze(1)
    pos[slot] += tree.depth
    real = torch.arange(t, device=dev).unsqueeze(0) <= counts.unsqueeze(1)  # [B, T]
    index = torch.arange(b_size * t, device=dev).view(b_size, t)  # SGLang fills every slot
    next_token, next_sibling = _next_pointers(req * t + tree.parent + 1, slot, local + 1, b_size, t)
    mask = torch.zeros(b_size, t, t, dtype=torch.bool, device=dev)
    mask[:, :, 0] = real
    anc = ancestor_mask(tree)
    width = anc.shape[1]
    mask[req.unsqueeze(1), (local + 1).unsqueeze(1), torch.arange(1, width + 1, device=dev)] = anc
    pad = ~real
    eye = torch.eye(t, dtype=torch.bool, device=dev).unsqueeze(0).expand(b_size, t, t)
    mask = torch.where(pad.unsqueeze(2), eye, mask)
    return SGLangVerifyLayout(draft, pos, index, next_token, next_sibling, mask, counts + 1)


def from_sglang(layout: SGLangVerifyLayout) -> tuple[TreeBatch, Tensor]:
    """Decode SGLang's layout back into (tree batch, root tokens [B]); log-probs are zero."""
    b_size, t = layout.retrive_next_token.shape
    draft = layout.draft_token.view(b_size, t).cpu()
    nxt, sib = layout.retrive_next_token.cpu(), layout.retrive_next_sibling.cpu()
    per_request: list[list[tuple[int, int, float]]] = []
    for b in range(b_size):
        parent = [NO_INDEX - 1] * t
        stack = [0]
        while stack:
            cur = stack.pop()
            child = int(nxt[b, cur])
            while child != NO_INDEX:
                parent[child] = cur
                stack.append(child)
                child = int(sib[b, child])
        n = int(layout.num_tokens[b]) - 1
        if any(parent[j] == NO_INDEX - 1 for j in range(1, n + 1)):
            raise TreeError(f"request {b}: next-token/sibling pointers do not reach every node")
        per_request.append([(int(draft[b, j]), parent[j] - 1, 0.0) for j in range(1, n + 1)])
    return make_tree(per_request), draft[:, 0].clone()
