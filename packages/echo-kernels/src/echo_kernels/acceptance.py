"""Tree acceptance over the packed super-tree: Triton kernels dispatched beside echo-core's rules.

The rules and their torch references live in echo-core (:mod:`echo_core.acceptance`); this
module adds the one-program-per-request Triton kernels and the dispatch. For the same inputs
the two backends return identical :class:`~echo_core.acceptance.AcceptResult` values (tested).
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.acceptance import PAD_NODE, AcceptResult
from echo_core.acceptance import greedy_accept as greedy_accept_reference
from echo_core.acceptance_stochastic import AcceptUniforms, draw_uniforms
from echo_core.acceptance_stochastic import stochastic_accept as stochastic_accept_reference
from echo_core.errors import AcceptanceError
from echo_core.tree import TreeBatch
from echo_kernels.backend import Backend, use_triton

NODE_BLOCK = 64
"""Nodes examined together by one program (a request's tree is walked in such blocks)."""

MAX_VOCAB_BLOCK = 1024
"""Vocabulary entries one program reads per step of a pass over a distribution."""


def _check_tree(tree: TreeBatch) -> None:
    for name in ("cu_nodes", "token", "parent", "depth"):
        t: Tensor = getattr(tree, name)
        if t.dtype != torch.int64 or t.dim() != 1 or not t.is_contiguous():
            raise AcceptanceError(
                f"tree.{name} must be a contiguous 1-D int64 tensor, got {t.dtype} {t.stride()}"
            )


def _trim(nodes: Tensor, num_accepted: Tensor) -> Tensor:
    """Cut ``nodes`` ([B, max_depth]) to the reference's width, the longest accepted path."""
    width = int(num_accepted.max()) if num_accepted.numel() else 0
    return nodes[:, :width]


def greedy_accept_triton(
    tree: TreeBatch,
    target_argmax: Tensor,  # [B+N] int64, contiguous, verify-row order
) -> AcceptResult:
    """Launch the greedy acceptance kernel after validating shapes, dtypes and contiguity."""
    _check_tree(tree)
    b, n = tree.batch_size, tree.num_nodes
    if target_argmax.shape != (b + n,) or target_argmax.dtype != torch.int64:
        raise AcceptanceError(
            f"target_argmax must be [B+N] = [{b + n}] int64, "
            f"got {tuple(target_argmax.shape)} {target_argmax.dtype}"
        )
    if not target_argmax.is_contiguous() or target_argmax.device != tree.device:
        raise AcceptanceError(f"target_argmax must be contiguous on {tree.device}")
    width = tree.max_depth()
    dev = tree.device
    accepted = torch.full((b, width), PAD_NODE, dtype=torch.int64, device=dev)
    num_accepted = torch.zeros(b, dtype=torch.int64, device=dev)
    bonus = torch.zeros(b, dtype=torch.int64, device=dev)
    if b:
        from echo_kernels.triton_kernels import greedy_accept_kernel

        greedy_accept_kernel[(b,)](
            tree.token, tree.parent, tree.depth, tree.cu_nodes, target_argmax,
            accepted, num_accepted, bonus, width, BLOCK=NODE_BLOCK,
        )  # fmt: skip
    return AcceptResult(_trim(accepted, num_accepted), num_accepted, bonus)


def greedy_accept(
    tree: TreeBatch,
    target_argmax: Tensor,  # [B+N] int64, target argmax per verify row
    *,
    backend: Backend = "auto",
) -> AcceptResult:
    """Greedy (temperature 0) tree acceptance: the deepest path matching the target's argmax.

    The rule is :func:`echo_core.acceptance.greedy_accept`'s; ``backend``: see
    :mod:`echo_kernels.backend`.
    """
    if use_triton(backend, tree.device):
        return greedy_accept_triton(tree, target_argmax)
    return greedy_accept_reference(tree, target_argmax)


def stochastic_accept_triton(
    tree: TreeBatch,
    target_probs: Tensor,  # [B+N, V] float32, contiguous
    sampled: Tensor,  # [N] bool, contiguous
    draft_probs: Tensor | None,  # [B+N, V] float32, contiguous
    uniforms: AcceptUniforms,  # node [N] float32, bonus [B] float32, contiguous
) -> AcceptResult:
    """Launch the stochastic acceptance kernel after validating shapes, dtypes and contiguity.

    Needs a [B, V] float32 scratch buffer (each request's residual distribution).
    """
    _check_tree(tree)
    b, n = tree.batch_size, tree.num_nodes
    if target_probs.dim() != 2 or target_probs.shape[0] != b + n:
        raise AcceptanceError(f"target_probs must be [B+N={b + n}, V], got {target_probs.shape}")
    vocab = target_probs.shape[1]
    named: list[tuple[str, Tensor, tuple[int, ...], torch.dtype]] = [
        ("target_probs", target_probs, (b + n, vocab), torch.float32),
        ("sampled", sampled, (n,), torch.bool),
        ("uniforms.node", uniforms.node, (n,), torch.float32),
        ("uniforms.bonus", uniforms.bonus, (b,), torch.float32),
    ]
    if draft_probs is not None:
        named.append(("draft_probs", draft_probs, (b + n, vocab), torch.float32))
    for name, t, shape, dtype in named:
        if t.shape != shape or t.dtype != dtype or t.device != tree.device:
            raise AcceptanceError(
                f"{name} must be {list(shape)} {dtype} on {tree.device}, "
                f"got {list(t.shape)} {t.dtype} on {t.device}"
            )
        if not t.is_contiguous():
            raise AcceptanceError(f"{name} must be contiguous, got strides {t.stride()}")
    for name, u in (("uniforms.node", uniforms.node), ("uniforms.bonus", uniforms.bonus)):
        if u.numel() and not bool(((u >= 0) & (u < 1)).all()):  # NaN fails too
            raise AcceptanceError(f"{name} must lie in [0, 1), got {u.tolist()}")
    if n and (vocab == 0 or int(tree.token.max()) >= vocab):  # the kernel indexes p by token
        raise AcceptanceError(f"token ids must be < vocab ({vocab})")
    if draft_probs is None and n and bool(sampled.any()):
        raise AcceptanceError("draft_probs is required when a node is sampled")
    dev = tree.device
    width = tree.max_depth()
    accepted = torch.full((b, width), PAD_NODE, dtype=torch.int64, device=dev)
    num_accepted = torch.zeros(b, dtype=torch.int64, device=dev)
    bonus = torch.zeros(b, dtype=torch.int64, device=dev)
    if b:
        from echo_kernels.triton_kernels import stochastic_accept_kernel

        scratch = torch.empty(b, vocab, dtype=torch.float32, device=dev)
        block_v = min(MAX_VOCAB_BLOCK, max(16, 1 << (vocab - 1).bit_length()))
        stochastic_accept_kernel[(b,)](
            tree.token, tree.parent, tree.depth, tree.cu_nodes, sampled.view(torch.int8),
            target_probs, target_probs if draft_probs is None else draft_probs,
            uniforms.node, uniforms.bonus, scratch, accepted, num_accepted, bonus,
            vocab, width, HAS_DRAFT=draft_probs is not None, BLOCK_V=block_v,
        )  # fmt: skip
    return AcceptResult(_trim(accepted, num_accepted), num_accepted, bonus)


def stochastic_accept(
    tree: TreeBatch,
    target_probs: Tensor,  # [B+N, V] float32, per verify row, after temperature/top-k/top-p
    sampled: Tensor,  # [N] bool, node drawn from draft_probs[parent_row] (else deterministic)
    draft_probs: Tensor | None,  # [B+N, V] float32 per verify row; required iff any sampled
    uniforms: AcceptUniforms | None = None,
    generator: torch.Generator | None = None,
    *,
    backend: Backend = "auto",
) -> AcceptResult:
    """Lossless stochastic tree acceptance (temperature > 0).

    The rule is :func:`echo_core.acceptance_stochastic.stochastic_accept`'s; without
    ``uniforms`` they are drawn by :func:`~echo_core.acceptance_stochastic.draw_uniforms` from
    ``generator``, so both backends consume the same randoms. ``backend``: see
    :mod:`echo_kernels.backend`.
    """
    if not use_triton(backend, tree.device):
        return stochastic_accept_reference(
            tree, target_probs, sampled, draft_probs, uniforms, generator
        )
    u = draw_uniforms(tree, generator) if uniforms is None else uniforms
    return stochastic_accept_triton(tree, target_probs, sampled, draft_probs, u)
