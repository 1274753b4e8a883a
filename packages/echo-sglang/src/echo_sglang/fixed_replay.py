"""ECHO's decisions over SGLang's EAGLE pool in the fixed layout: no host sync (issue #44).

:class:`~echo_sglang.selection.PoolReplay` replays EAGLE's finished pool through the packed
policy driver, growing views of it depth by depth (83-107 host syncs a step at B = 16-256).
:class:`FixedPoolReplay` feeds ``echo_device``
(:class:`~echo_scheduler.device.adapter.DeviceEchoPolicy`) one [B, n_d] slab per EAGLE step
instead, read straight from SGLang's lists (:mod:`~echo_sglang.eagle_pool` states their layout):

- depth 1: the root's children, column ``w`` = EAGLE candidate ``w`` (rank w);
- depth d >= 2: for ECHO's frontier entry ``f`` (a depth-(d-1) candidate ``c_f``), EAGLE
  expanded it iff ``c_f`` is the ``r``-th node of step d - 1's expansion list
  (``parents[1 + (d - 2) k + r]``); then column ``f k + w`` is candidate
  ``k + (d - 2) k^2 + r k + w``, else the entry's columns are invalid (EAGLE drafted nothing
  there; ECHO's frontier is its own, not EAGLE's).

Path and draft log-probabilities are those of :func:`~echo_sglang.eagle_pool.pool_from_eagle`
(``log max(score, MIN_SCORE)``, less the parent's), so the decisions equal ``PoolReplay``'s with
``echo`` on the same pool (tested). A depth at which nothing was drafted anywhere truncates no
one (``gate_empty=False``): ``PoolReplay`` ends drafting there before the gate. The choice comes
back as masks over the pool's nodes and as a :class:`~echo_sglang.fixed_encode.SlotTree`, which
:func:`~echo_sglang.fixed_encode.fixed_verify_input` encodes for SGLang without a host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import select_nodes
from echo_scheduler.device import DepthSlab, Frontier
from echo_scheduler.device.adapter import DeviceEchoPolicy
from echo_scheduler.device.driver import drive_fixed_step
from echo_scheduler.interface import StepBatch
from echo_sglang.eagle_pool import EaglePool, log_scores
from echo_sglang.fixed_encode import SlotTree
from echo_sglang.selection import Selection


def eagle_slab(
    log_score: Tensor,
    parents: Tensor,
    topk: int,
    depth: int,
    width: int,
    front: tuple[Tensor, Frontier] | None,
) -> tuple[DepthSlab, Tensor]:
    """Depth ``depth``'s slab of ECHO's frontier (module docstring) and the EAGLE candidate of
    every slot ([B, n_d] int64, -1 where invalid). ``log_score`` [B, M] float32; ``front``: the
    previous depth's slot candidates and ECHO's frontier over them (None at depth 1, where
    ``width`` is the roots' drafted width, 0 for none)."""
    b, k = log_score.shape[0], topk
    dev = log_score.device
    w = torch.arange(k, device=dev)
    if front is None:
        cand = w.expand(b, k)
        valid = (w < width).expand(b, k)
        path = log_score[:, :k]
        parent_path = torch.zeros_like(path)
    else:
        prev, frontier = front
        entry = prev.gather(1, frontier.slot)  # [B, F] candidate of each frontier entry
        lo = 1 + (depth - 2) * k
        block = parents[:, lo : lo + k]  # [B, k] the nodes EAGLE expanded at step depth - 1
        hit = (block.unsqueeze(1) == entry.unsqueeze(2)) & (frontier.expand & (entry >= 0))[
            ..., None
        ]  # [B, F, k]
        r = hit.to(torch.int64).argmax(dim=2)  # [B, F]
        found = hit.any(dim=2)
        base = k + (depth - 2) * k * k + r * k  # [B, F]
        cand = (base.unsqueeze(2) + w).reshape(b, -1)  # [B, F k]
        valid = found.unsqueeze(2).expand(-1, -1, k).reshape(b, -1)
        parent_path = log_score.gather(1, entry.clamp(min=0)).repeat_interleave(k, dim=1)
        path = log_score.gather(1, cand)
    draft = path - parent_path
    inf = torch.full_like(path, -torch.inf)
    slab = DepthSlab(torch.where(valid, path, inf), torch.where(valid, draft, inf), valid)
    return slab, torch.where(valid, cand, -1)


class EagleSlabs:
    """EAGLE's finished pool as the fixed driver's slab source (module docstring); keeps, per
    depth served, every slot's candidate, its parent's column and its depth."""

    gate_empty = False  # a finished pool: nothing drafted at a depth ends drafting there

    def __init__(self, scores: Tensor, parents: Tensor, topk: int) -> None:
        self.log_score = log_scores(scores)
        self.parents, self.topk = parents, topk
        self.cands: list[Tensor] = []  # [B, n_d] candidate per slot, -1 where invalid
        self.parent_cols: list[Tensor] = []  # [B, n_d] the parent's column, -1 at depth 1
        self.depth_cols: list[Tensor] = []  # [n_d] the depth
        self._offset = 0  # first column of the depth served last

    def slab(self, depth: int, width: int, front: Frontier | None) -> DepthSlab:
        k = self.topk
        prev = None if front is None else (self.cands[-1], front)
        slab, cand = eagle_slab(self.log_score, self.parents, k, depth, width, prev)
        if front is None:
            parent_col = torch.full_like(cand, -1)
        else:
            parent_col = (self._offset + front.slot).repeat_interleave(k, dim=1)
            self._offset += self.cands[-1].shape[1]
        self.cands.append(cand)
        self.parent_cols.append(parent_col)
        self.depth_cols.append(torch.full((cand.shape[1],), depth, device=cand.device))
        return slab


@dataclass(frozen=True, slots=True)
class FixedChoice:
    """What ``echo_device`` chose from one EAGLE pool, as masks (no host sync to build)."""

    slots: SlotTree  # the selection in the slab layout, for fixed_verify_input
    keep: Tensor  # [N] bool over the pool's nodes: the SuperTree
    drafted: Tensor  # [N] bool over the pool's nodes: what the policy drafted (its gates saw)

    def selection(self, pool: EaglePool) -> Selection:
        """The packed :class:`~echo_sglang.selection.Selection` (host syncs: for feedback,
        after verification, and for tests)."""
        return Selection(
            select_nodes(pool.tree, self.keep), self.keep.nonzero().squeeze(1), self.drafted
        )


class FixedPoolReplay:
    """``echo_device`` driven once per decode step over an EAGLE pool (module docstring)."""

    def __init__(self, policy: DeviceEchoPolicy) -> None:
        self.policy = policy

    def decide(
        self, pool: EaglePool, scores: Tensor, tokens: Tensor, parents: Tensor, batch: StepBatch
    ) -> FixedChoice:
        """``echo_device``'s choice from ``pool`` (built from ``scores``, ``tokens`` and
        ``parents``, SGLang's concatenated lists), with no host sync once ``batch.max_nodes``
        is on the host (the policy's host part reads it)."""
        b, m = scores.shape
        dev = scores.device
        source = EagleSlabs(scores, parents, pool.topk)
        driven = drive_fixed_step(self.policy, source, batch, pool.num_steps, dev)
        chosen = torch.zeros(b, m + 1, dtype=torch.bool, device=dev)  # column m: dropped
        drafted = torch.zeros(b, m + 1, dtype=torch.bool, device=dev)
        if driven.keep is not None:
            cand = torch.cat(source.cands, dim=1)
            keep = driven.keep & (cand >= 0)
            where = torch.where(cand >= 0, cand, m)
            chosen.scatter_(1, where, keep)
            drafted.scatter_(1, where, cand >= 0)
            token = tokens.to(torch.int64).gather(1, cand.clamp(min=0))
            parent = torch.cat(source.parent_cols, dim=1)
            slots = SlotTree(keep, token, parent, torch.cat(source.depth_cols))
        else:
            empty = torch.zeros(b, 0, dtype=torch.int64, device=dev)
            none = torch.zeros(0, dtype=torch.int64, device=dev)
            slots = SlotTree(empty.bool(), empty, empty, none)
        perm = pool.flat_index.view(b, m)  # pool node -> candidate
        return FixedChoice(
            slots, chosen.gather(1, perm).reshape(-1), drafted.gather(1, perm).reshape(-1)
        )

    def select(
        self, pool: EaglePool, scores: Tensor, tokens: Tensor, parents: Tensor, batch: StepBatch
    ) -> Selection:
        """:meth:`decide` as a packed :class:`~echo_sglang.selection.Selection`."""
        return self.decide(pool, scores, tokens, parents, batch).selection(pool)
