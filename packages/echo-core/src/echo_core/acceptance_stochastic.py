"""Lossless stochastic tree acceptance (temperature > 0, top-k / top-p): the torch reference.

Inputs are per verify row (:mod:`echo_core.verify_rows`): ``P[r]`` the target distribution
after temperature / top-k / top-p (:func:`echo_core.sampling.target_probs`), ``Q[r]`` the draft
distribution the children of row ``r`` were sampled from. A node is *sampled* (drawn i.i.d.
from ``Q[parent_row]``, SpecInfer style) or *deterministic* (chosen by the drafter, e.g. its
top-k); all children of one parent are of one kind. Per request, with uniforms ``u_i`` (one
per node) and ``u_b`` (one per request), all in ``[0, 1)``:

    cur = root; p = P[row(cur)]
    for x in children(cur), in node order:
        deterministic: accept iff u_x < p(x) / sum(p)
                       else p(x) = 0; p = p / sum(p)        (p unchanged if sum(p) is 0)
        sampled:       accept iff u_x < min(1, p(x) / q(x)),   q = Q[row(cur)]
                       else p = max(p - q, 0) / sum(max(p - q, 0))   (same fallback)
        on accept:     cur = x; p = P[row(x)]; restart the loop over x's children
    bonus = min(first j with cumsum(p)[j] > u_b * sum(p), last j with p(j) > 0)

A deterministic candidate is a test "is the next token x?" with the exact conditional
probability, and the sampled rule is multi-draft speculative sampling (Miao et al., 2024,
SpecInfer): either way the token emitted after ``cur`` is distributed as ``P[row(cur)]``, so the
emitted sequence follows the target distribution exactly (lossless).

This reference runs the rule for the whole batch in lock step: each iteration tries one
candidate per active request (O(n_b) iterations of [B, V] tensor ops). Kernels are compared
against it bit for bit through :class:`AcceptUniforms`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.acceptance import AcceptResult, result_from_leaf
from echo_core.errors import AcceptanceError
from echo_core.tree import TreeBatch
from echo_core.verify_rows import node_rows, parent_rows, root_rows

NO_NODE = -1
"""No candidate / no child (in the first-child and next-sibling links)."""


@dataclass(frozen=True, slots=True)
class AcceptUniforms:
    """The random numbers of one stochastic acceptance step, all in ``[0, 1)``."""

    node: Tensor  # [N] float32, u_x: accept test of packed node x
    bonus: Tensor  # [B] float32, u_b: inverse-CDF draw of request b's bonus token


def draw_uniforms(tree: TreeBatch, generator: torch.Generator | None = None) -> AcceptUniforms:
    """``node = rand(N)`` then ``bonus = rand(B)`` from ``generator`` on the tree's device."""
    f32, dev = torch.float32, tree.device
    node = torch.rand(tree.num_nodes, generator=generator, dtype=f32, device=dev)
    bonus = torch.rand(tree.batch_size, generator=generator, dtype=f32, device=dev)
    return AcceptUniforms(node=node, bonus=bonus)


def _check(
    tree: TreeBatch,
    target: Tensor,
    sampled: Tensor,
    draft: Tensor | None,
    u: AcceptUniforms,
) -> None:
    b, n = tree.batch_size, tree.num_nodes
    if target.dim() != 2 or target.shape[0] != b + n or target.dtype != torch.float32:
        raise AcceptanceError(
            f"target_probs must be [B+N, V] = [{b + n}, V] float32, "
            f"got {list(target.shape)} {target.dtype}"
        )
    vocab = target.shape[1]
    named: list[tuple[str, Tensor, tuple[int, ...], torch.dtype]] = [
        ("sampled", sampled, (n,), torch.bool),
        ("uniforms.node", u.node, (n,), torch.float32),
        ("uniforms.bonus", u.bonus, (b,), torch.float32),
    ]
    if draft is not None:
        named.append(("draft_probs", draft, (b + n, vocab), torch.float32))
    for name, t, shape, dtype in named:
        if t.shape != shape or t.dtype != dtype:
            raise AcceptanceError(
                f"{name} must be {list(shape)} {dtype}, got {list(t.shape)} {t.dtype}"
            )
    for name, t in [("target_probs", target), *[(nm, t) for nm, t, _, _ in named]]:
        if t.device != tree.device:
            raise AcceptanceError(f"{name} is on {t.device}, tree on {tree.device}")
    for name, t in (("uniforms.node", u.node), ("uniforms.bonus", u.bonus)):
        bad = ~((t >= 0) & (t < 1))  # NaN is bad too
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise AcceptanceError(f"{name} must lie in [0, 1), got {name}[{i}] = {float(t[i])}")
    if n == 0:
        return
    if vocab == 0 or int(tree.token.max()) >= vocab:
        raise AcceptanceError(f"token id {int(tree.token.max())} is outside the vocab of {vocab}")
    if draft is None and bool(sampled.any()):
        raise AcceptanceError("draft_probs is required when a node is sampled")
    # Siblings share a parent row; one kind per parent means min == max of sampled over it.
    rows, kind = parent_rows(tree), sampled.to(torch.int64)
    lo = torch.full((b + n,), 1, dtype=torch.int64, device=tree.device)
    hi = torch.zeros(b + n, dtype=torch.int64, device=tree.device)
    lo.scatter_reduce_(0, rows, kind, reduce="amin")
    hi.scatter_reduce_(0, rows, kind, reduce="amax")
    mixed = (lo == 0) & (hi == 1)
    if bool(mixed.any()):
        r = int(mixed.nonzero()[0])
        raise AcceptanceError(
            f"children of verify row {r} mix sampled and deterministic nodes: "
            f"sampled={sampled[rows == r].tolist()}"
        )


def _links(tree: TreeBatch) -> tuple[Tensor, Tensor]:
    """``first_child`` per verify row ([B+N]) and ``next_sibling`` per node ([N]), packed ids."""
    n = tree.num_nodes
    rows = parent_rows(tree)
    ids = torch.arange(n, device=tree.device)
    first = torch.full((tree.batch_size + n,), n, dtype=torch.int64, device=tree.device)
    first.scatter_reduce_(0, rows, ids, reduce="amin")
    first = torch.where(first == n, NO_NODE, first)
    # Stable sort by parent row keeps node order among siblings: the next entry is the sibling.
    order = torch.sort(rows, stable=True).indices
    nxt = torch.full((n,), NO_NODE, dtype=torch.int64, device=tree.device)
    same = rows[order[1:]] == rows[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    return first, nxt


def _bonus(p: Tensor, u: Tensor) -> Tensor:  # p: [B, V] float32, u: [B] float32 -> [B] int64
    """Inverse CDF: the first j with ``cumsum(p)[j] > u * sum(p)``, clamped to the last j with
    ``p(j) > 0``; ``sum(p)`` is taken as ``cumsum(p)[V-1]``."""
    cdf = torch.cumsum(p, dim=-1)
    first = (cdf <= (u * cdf[:, -1])[:, None]).sum(dim=-1)
    vocab = p.shape[1]
    last_pos = vocab - 1 - torch.argmax((p > 0).flip(-1).to(torch.int8), dim=-1)
    return torch.minimum(first, last_pos)


def stochastic_accept(
    tree: TreeBatch,
    target_probs: Tensor,  # [B+N, V] float32, per verify row, after temperature/top-k/top-p
    sampled: Tensor,  # [N] bool, node drawn from draft_probs[parent_row] (else deterministic)
    draft_probs: Tensor | None,  # [B+N, V] float32 per verify row; required iff any sampled
    uniforms: AcceptUniforms | None = None,
    generator: torch.Generator | None = None,
) -> AcceptResult:
    """Run the lossless acceptance rule of the module docstring for every request.

    ``uniforms`` fixes the randomness (for bit-exact comparisons); without it they are drawn
    by :func:`draw_uniforms` from ``generator``. Raises :class:`AcceptanceError` on inputs that
    do not fit the tree.
    """
    u = draw_uniforms(tree, generator) if uniforms is None else uniforms
    _check(tree, target_probs, sampled, draft_probs, u)
    b, dev = tree.batch_size, tree.device
    first, nxt = _links(tree)
    rows_of = node_rows(tree)
    req = torch.arange(b, device=dev)
    cur_row = root_rows(tree)  # [B] verify row of the current (last accepted) node
    leaf = torch.full((b,), NO_NODE, dtype=torch.int64, device=dev)  # [B] last accepted node
    p = target_probs[cur_row].clone()  # [B, V] current (residual) target distribution
    cand = first[cur_row]  # [B] packed id of the candidate being tried, NO_NODE when done
    while bool((cand >= 0).any()):
        a = req[cand >= 0]  # active requests
        x = cand[a]
        tok = tree.token[x][:, None]
        pa = p[a]
        px = pa.gather(1, tok).squeeze(1)
        is_s = sampled[x]
        accept = u.node[x] < px / pa.sum(dim=-1)
        if draft_probs is not None and bool(is_s.any()):
            qa = draft_probs[cur_row[a]]
            ratio = torch.clamp(px / qa.gather(1, tok).squeeze(1), max=1.0)
            accept = torch.where(is_s, u.node[x] < ratio, accept)
            residual = torch.clamp(pa - qa, min=0.0)
        else:
            residual = pa
        residual = torch.where(is_s[:, None], residual, pa.scatter(1, tok, 0.0))
        mass = residual.sum(dim=-1, keepdim=True)
        residual = torch.where(mass > 0, residual / mass, pa)  # zero mass: keep p (rounding)
        acc, rej = a[accept], a[~accept]
        new_rows = rows_of[x[accept]]
        p[rej] = residual[~accept]
        p[acc] = target_probs[new_rows]
        cur_row[acc] = new_rows
        leaf[acc] = x[accept]
        cand[acc] = first[new_rows]
        cand[rej] = nxt[x[~accept]]
    return result_from_leaf(tree, leaf, _bonus(p, u.bonus))
