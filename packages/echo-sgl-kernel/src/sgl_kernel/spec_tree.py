"""Draft trees for SGLang's CPU speculative path: build, greedy verify, rebuild from a mask.

Pure-torch versions of ``sgl_kernel.build_tree_kernel_efficient_cpu``,
``sgl_kernel.verify_tree_greedy_cpu`` (both called from
``sglang/kernels/ops/speculative/spec_tree.py``) and
``sgl_kernel.speculative.reconstruct_indices_from_tree_mask`` (NGRAM,
``sglang/kernels/ops/speculative/reconstruct_tree.py``). Each writes into the caller's tensors,
as the compiled kernels do, and touches exactly the elements they touch.

SGLang's tree encoding, per request b of a batch of B with T tree nodes: node 0 is the root (the
last verified token), nodes 1..T-1 are the draft tokens. ``retrive_index[b, i] = b * T + i`` is
node i's flat slot in the verify batch; ``retrive_next_token[b, p]`` is p's first child and
``retrive_next_sibling[b, c]`` the next child of c's parent after c, -1 ending either list.
Example, T = 4, parents (-, 0, 0, 1): next_token = [1, 3, -1, -1], next_sibling = [-1, 2, -1, -1],
positions = seq_len + [0, 1, 1, 2].
"""

from __future__ import annotations

import torch
from torch import Tensor

from sgl_kernel.spec_checks import as_long, flat_view, require_integer, require_shape

NO_NODE = -1
"""SGLang's sentinel for "no child / no sibling / not accepted"."""

FULL_MASK = 0
"""tree_mask rows of ``seq_len + T`` columns (prefix then tree) per draft token."""
QLEN_ONLY = 1
"""tree_mask rows of T columns (tree only), [B, T, T] flattened; SGLang's CPU default."""
QLEN_ONLY_BITPACKING = 2
"""Bit-packed QLEN_ONLY rows: no CPU producer; SGLang's current CPU kernel rejects it, as here."""


def _parent_nodes(parent_list: Tensor, selected_index: Tensor, topk: int) -> Tensor:
    """Parent node of every tree node, [B, T] int64: 0 for children of the root, -1 for node 0
    and for a node whose parent token was not selected into the tree.

    Draft token i (node i + 1) was score entry ``selected_index[b, i]``; its parent is beam
    ``selected_index[b, i] // topk`` of ``parent_list`` (beam 0 = the root), whose score entry is
    ``parent_list[b, beam]``; the parent node is 1 + the first position of that entry in
    ``selected_index[b]``.
    """
    b, width = parent_list.shape
    sel = selected_index.to(torch.int64)  # [B, T-1]
    root = torch.full((b, 1), NO_NODE, dtype=torch.int64)
    if sel.shape[1] == 0:
        return root
    beam = torch.div(sel, topk, rounding_mode="trunc")
    below_root = beam > 0
    if bool(below_root.any()):
        top = int(beam.max())
        if top >= width:
            raise ValueError(f"selected_index points at parent beam {top}, parent_list has {width}")
        parent_entry = parent_list.to(torch.int64).gather(1, beam.clamp(min=0))
    else:
        parent_entry = torch.zeros_like(sel)
    hits = sel.unsqueeze(1) == parent_entry.unsqueeze(2)  # [B, node i, position pp]
    first = hits.to(torch.int8).argmax(dim=2)  # first maximal value: the first hit
    parent = torch.where(hits.any(dim=2), first + 1, NO_NODE)
    parent = torch.where(below_root, parent, 0)
    return torch.cat((root, parent), dim=1)


def _link_children(parent: Tensor, next_token: Tensor, next_sibling: Tensor) -> None:
    """Write SGLang's first-child / next-sibling lists of ``parent`` [B, T] in place.

    The compiled kernel visits nodes T-1 down to 1 and pushes each onto its parent's child list,
    so a parent's first child is its smallest child and siblings run in increasing order; the
    largest child inherits whatever ``next_token[parent]`` held before when that was not -1.
    Entries of nodes without children or later siblings are left untouched.
    """
    t = parent.shape[1]
    if t < 2:
        return
    par = parent[:, 1:]  # [B, T-1]: parent of nodes 1..T-1
    linked = par >= 0
    nodes = torch.arange(1, t)
    is_child = (par.unsqueeze(1) == torch.arange(t).view(1, t, 1)) & linked.unsqueeze(1)
    first_child = torch.where(is_child, nodes, t).amin(dim=2)  # [B, T]
    later = nodes.view(1, -1, 1) < nodes.view(1, 1, -1)
    same = (par.unsqueeze(2) == par.unsqueeze(1)) & linked.unsqueeze(2) & later
    sibling = torch.where(same, nodes, t).amin(dim=2)  # [B, T-1]
    old_first = next_token.to(torch.int64).gather(1, par.clamp(min=0))
    inherits = linked & (sibling == t) & (old_first != NO_NODE)
    old_sibling = next_sibling[:, 1:].to(torch.int64)
    new_sibling = torch.where(sibling < t, sibling, torch.where(inherits, old_first, old_sibling))
    next_sibling[:, 1:] = new_sibling
    next_token.copy_(torch.where(first_child < t, first_child, next_token.to(torch.int64)))


def _path_masks(parent: Tensor, depth: int) -> tuple[Tensor, Tensor]:
    """Self-and-ancestors mask [B, T, T] bool and tree depth [B, T] int64 of every node.

    Row i marks column 0 (the root) and, walking up from i at most ``depth`` steps, every node
    met before the root; the number of marked draft nodes is i's depth. A walk that reaches a
    node without a parent (-1) stops there, as the kernels do.
    """
    b, t = parent.shape
    marks = torch.zeros((b, t, t), dtype=torch.bool)
    marks[:, :, 0] = True
    node = torch.arange(t).expand(b, t).clone()
    active = node > 0
    levels = torch.zeros((b, t), dtype=torch.int64)
    columns = torch.arange(t)
    for _ in range(depth):
        marks |= (columns == node.unsqueeze(2)) & active.unsqueeze(2)
        levels += active
        up = parent.gather(1, node)
        active &= up > 0
        node = torch.where(active, up, node)
    return marks, levels


def build_tree_kernel_efficient_cpu(
    parent_list: Tensor,  # [B, topk * (depth - 1) + 1] int, score entry of each beam
    selected_index: Tensor,  # [B, T - 1] int, score entries chosen as draft tokens, sorted
    verified_seq_len: Tensor,  # [B] int, tokens already in the KV cache
    tree_mask: Tensor,  # bool, flat, written (see FULL_MASK / QLEN_ONLY)
    positions: Tensor,  # [B * T] int64, written
    retrive_index: Tensor,  # [B, T] int64, written
    retrive_next_token: Tensor,  # [B, T] int64, updated (callers pass -1)
    retrive_next_sibling: Tensor,  # [B, T] int64, updated (callers pass -1)
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Build the verify tree of an EAGLE draft: links, positions and attention mask, in place.

    Computes, for T = ``draft_token_num`` nodes per request, the child/sibling lists (module
    docstring), ``retrive_index = b T + i``, ``positions[b T + i] = seq_len[b] + depth(i)`` and
    the mask row of every node (itself, its ancestors and the root). With FULL_MASK, row (b, i)
    starts at ``T^2 b + T sum(seq_len[:b]) + (seq_len[b] + T) i`` and only its last T columns are
    written (the caller fills the prefix); with QLEN_ONLY the whole [B, T, T] block is written.
    """
    t = draft_token_num
    b = verified_seq_len.shape[0]
    if t < 1 or topk < 1 or depth < 0:
        raise ValueError(
            f"need draft_token_num, topk >= 1 and depth >= 0, got {t}, {topk}, {depth}"
        )
    if tree_mask_mode == QLEN_ONLY_BITPACKING:
        raise NotImplementedError("QLEN_ONLY_BITPACKING tree masks are not built on CPU")
    if tree_mask_mode not in (FULL_MASK, QLEN_ONLY):
        raise ValueError(
            f"tree_mask_mode must be 0 (FULL_MASK) or 1 (QLEN_ONLY), got {tree_mask_mode}"
        )
    require_integer(parent_list, "parent_list")
    require_integer(selected_index, "selected_index")
    if parent_list.dim() != 2 or parent_list.shape[0] != b:
        raise ValueError(f"parent_list must be [B={b}, P], got {tuple(parent_list.shape)}")
    require_shape(selected_index, "selected_index", (b, t - 1))
    for name, out in (
        ("retrive_index", retrive_index),
        ("retrive_next_token", retrive_next_token),
        ("retrive_next_sibling", retrive_next_sibling),
    ):
        require_shape(out, name, (b, t))
    seq_len = as_long(verified_seq_len, "verified_seq_len")

    parent = _parent_nodes(parent_list, selected_index, topk)
    _link_children(parent, retrive_next_token, retrive_next_sibling)
    retrive_index.copy_(torch.arange(b * t).view(b, t))
    marks, levels = _path_masks(parent, depth)
    flat_view(positions, "positions", b * t)[: b * t] = (seq_len.unsqueeze(1) + levels).view(-1)

    cols = torch.arange(t)
    if tree_mask_mode == QLEN_ONLY:
        mask = flat_view(tree_mask, "tree_mask", b * t * t)
        mask[: b * t * t] = marks.view(-1)
        return
    before = torch.cumsum(seq_len, 0) - seq_len
    start = t * t * torch.arange(b) + t * before  # [B] first mask element of request b
    row = start.unsqueeze(1) + (seq_len.unsqueeze(1) + t) * cols + seq_len.unsqueeze(1)
    need = int(seq_len.sum()) * t + b * t * t
    mask = flat_view(tree_mask, "tree_mask", need)
    mask[(row.unsqueeze(2) + cols).view(-1)] = marks.view(-1)


def _matching_child(
    candidates: Tensor, next_token: Tensor, next_sibling: Tensor, target: Tensor
) -> Tensor:
    """First child, in sibling order, whose draft token equals its parent's target, [B, T].

    ``target[b, p]`` is the target model's token after node p; -1 where no child matches. At
    most T siblings are examined, as in the kernels.
    """
    b, t = candidates.shape
    child = next_token
    chosen = torch.full((b, t), NO_NODE, dtype=torch.int64)
    pending = torch.ones((b, t), dtype=torch.bool)
    for _ in range(t):
        exists = child >= 0
        safe = child.clamp(min=0)
        hit = pending & exists & (candidates.gather(1, safe) == target)
        chosen = torch.where(hit, child, chosen)
        pending &= exists & ~hit
        if not bool(pending.any()):
            break
        child = torch.where(exists, next_sibling.gather(1, safe), NO_NODE)
    return chosen


def verify_tree_greedy_cpu(
    predicts: Tensor,  # [B * T] int32, written at the accepted slots
    accept_index: Tensor,  # [B, L] int32, written up to the accepted length (callers pass -1)
    accept_token_num: Tensor,  # [B] int32, written
    candidates: Tensor,  # [B, T] int, draft token of every node (the root's is the bonus)
    retrive_index: Tensor,  # [B, T] int, flat slot of every node
    retrive_next_token: Tensor,  # [B, T] int, first child
    retrive_next_sibling: Tensor,  # [B, T] int, next sibling
    target_predict: Tensor,  # [B, T] int, target argmax at every flat slot
) -> None:
    """Greedy tree verify: follow the target's tokens down the draft tree, in place.

    From the root, at each of at most L - 1 levels, accept the first child (sibling order) whose
    draft token equals the target token at the last accepted node's slot; stop when none does.
    Writes ``accept_index[b, :n + 1]`` = flat slots of the root and the n accepted nodes,
    ``accept_token_num[b] = n`` and ``predicts[s] = target_predict[s]`` at those n + 1 slots (the
    last one carries the bonus token). Every other element is left as the caller set it.
    """
    if candidates.dim() != 2 or accept_index.dim() != 2:
        raise ValueError(
            f"candidates and accept_index must be 2-D, got {tuple(candidates.shape)} "
            f"and {tuple(accept_index.shape)}"
        )
    b, t = candidates.shape
    width = accept_index.shape[1]
    if accept_index.shape[0] != b or width < 1:
        raise ValueError(f"accept_index must be [B={b}, L>=1], got {tuple(accept_index.shape)}")
    require_shape(accept_token_num, "accept_token_num", (b,))
    for name, tensor in (
        ("retrive_index", retrive_index),
        ("retrive_next_token", retrive_next_token),
        ("retrive_next_sibling", retrive_next_sibling),
    ):
        require_shape(tensor, name, (b, t))
    if target_predict.numel() != b * t:
        raise ValueError(
            f"target_predict must hold B*T={b * t} tokens, got {target_predict.numel()}"
        )
    cand = as_long(candidates, "candidates").view(b, t)
    slot = as_long(retrive_index, "retrive_index").view(b, t)
    first = as_long(retrive_next_token, "retrive_next_token").view(b, t)
    sibling = as_long(retrive_next_sibling, "retrive_next_sibling").view(b, t)
    target = as_long(target_predict, "target_predict")
    out = flat_view(predicts, "predicts")
    if b == 0:
        return

    chosen = _matching_child(cand, first, sibling, target[slot])
    path = torch.full((b, width), NO_NODE, dtype=torch.int64)  # accepted nodes, root first
    path[:, 0] = 0
    node = torch.zeros((b, 1), dtype=torch.int64)
    alive = torch.ones((b, 1), dtype=torch.bool)
    for level in range(1, width):
        nxt = chosen.gather(1, node)
        alive &= nxt >= 0
        node = torch.where(alive, nxt, node)
        path[:, level : level + 1] = torch.where(alive, node, NO_NODE)
    accepted = path >= 0
    slots = slot.gather(1, path.clamp(min=0))[accepted]
    accept_index[accepted] = slots.to(accept_index.dtype)
    accept_token_num.copy_(accepted.sum(dim=1) - 1)
    out[slots] = target[slots].to(out.dtype)


def reconstruct_indices_from_tree_mask(
    tree_mask: Tensor,  # [B * T * T] bool/int, row i marks i and its ancestors
    verified_seq_len: Tensor,  # [B] int
    positions: Tensor,  # [B * T] int64, written
    retrive_index: Tensor,  # [B * T] int64, written
    retrive_next_token: Tensor,  # [B * T] int64, written
    retrive_next_sibling: Tensor,  # [B * T] int64, written
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Tree indices of NGRAM drafts from their QLEN_ONLY mask, in place.

    With ``A[i, j] = mask[i, j] and j < i`` (j is an ancestor of i): ``positions = seq_len +
    sum_j A[i, j]``; parent(i) = the largest ancestor; next_token(i) = the smallest k with
    ``A[k, i]``; next_sibling(i) = the smallest k > i with i's parent (-1 for a parentless i);
    ``retrive_index = b T + i``. Every element of the B * T outputs is written.
    """
    b, n = batch_size, draft_token_num
    if b == 0:
        return
    if n < 1:
        raise ValueError(f"draft_token_num must be >= 1, got {n}")
    cells = flat_view(tree_mask, "tree_mask", b * n * n)[: b * n * n].view(b, n, n)
    seq_len = as_long(verified_seq_len, "verified_seq_len")[:b]
    idx = torch.arange(n)
    rows, cols = idx.view(1, n, 1), idx.view(1, 1, n)
    anc = cells.to(torch.bool) & (cols < rows)  # [B, node i, ancestor j]
    parent = torch.where(anc, cols, NO_NODE).amax(dim=2)  # [B, n]
    first_desc = torch.where(anc, rows, n).amin(dim=1)  # smallest descendant of each column
    same = (parent.unsqueeze(2) == parent.unsqueeze(1)) & (rows > cols)  # [B, k, i]
    first_sib = torch.where(same, rows, n).amin(dim=1)

    def write(out: Tensor, name: str, value: Tensor) -> None:
        flat_view(out, name, b * n)[: b * n] = value.reshape(-1)

    write(positions, "positions", seq_len.unsqueeze(1) + anc.sum(dim=2))
    write(retrive_index, "retrive_index", torch.arange(b * n))
    write(retrive_next_token, "retrive_next_token", torch.where(first_desc < n, first_desc, -1))
    sibling = torch.where((parent >= 0) & (first_sib < n), first_sib, NO_NODE)
    write(retrive_next_sibling, "retrive_next_sibling", sibling)
