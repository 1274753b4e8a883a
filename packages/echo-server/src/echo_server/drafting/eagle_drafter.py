"""The EAGLE-head drafter: the engine's :class:`~echo_server.drafting.base.Drafter` over a
trained :class:`~echo_server.drafting.eagle_head.EagleHead`.

Per request it keeps the head's KV cache over the *committed* context and the head's output at
the last committed row. Bookkeeping, with the root (the last emitted token) at position P:

- ``observe``: committed rows t (target feature ``f_t``) become head rows ``(f_t, x_{t+1})`` at
  position t+1, where ``x_{t+1}`` is the next committed token, or ``next_token`` for the last
  row. So after observing rows ..P-1 the head's last row is ``(f_{P-1}, root)`` at position P and
  its output (predicted ``f_P``) is kept; ``log q`` of the token after the root is computed when
  the root is expanded (depth 1 needs no other forward). The head's cache only ever holds rows
  built from target features.
- Deferred catch-up: committed rows, the prompt's included, are only queued; they run (one
  batched pass over every request being drafted) when the request's root is next expanded. A
  step the policy decodes plainly therefore costs the head nothing, and a request that finishes
  undrafted never runs them, not even its prompt (at c=32 on mtbench ECHO verifies 1.6-1.7 draft
  rows a step for 32 requests). Running every prompt through the head at prefill had put ECHO's
  total prefill time at c=32 4% (mtbench) and 15% (humaneval) above plain decoding's; deferred,
  0.6% above and 3% below (two machines: docs/lab/2026-12-04.md). A request with
  ``max_pending`` rows queued runs them at once (memory bound). Running queued rows later is the
  same causal computation as running them step by step.
- ``expand`` of a node n at depth d >= 1 (path ``c_1..c_d`` from the root): one row
  ``(f^_parent, c_d)`` at position P+d, where ``f^_parent`` is the output of the parent's row (the
  kept root output for d = 1). It attends to the whole committed cache, the rows of its
  ancestors and itself (tree attention; :func:`tree_mask`). Its output gives its children.
  All nodes of one call go through one batched fc / q,k,v / MLP / output-head pass; attention
  runs per request (its own cache length).
- ``begin_step`` drops the previous step's tree rows; ``release`` drops the request.

Draft log-probs are normalised over the draft vocabulary and mapped back to target ids.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from echo_server.assets import DEFAULT_HEAD
from echo_server.drafting.base import ExpandRequest, Proposals, TargetFeedback
from echo_server.drafting.eagle_checkpoint import load_head
from echo_server.drafting.eagle_head import EagleHead
from echo_server.model.linear import packing_available
from echo_server.model.llama import LlamaModel

MAX_PENDING = 256
"""Queued committed rows per request before they are run without waiting for a draft."""

DRAFT_DTYPE: torch.dtype | None = None
"""Default compute dtype of the drafter: None picks it per machine (:func:`default_draft_dtype`)."""

DRAFT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def default_draft_dtype() -> torch.dtype:
    """The drafter's compute dtype on this machine: ``ECHO_DRAFT_DTYPE`` (``float32``,
    ``bfloat16``, or ``auto``, the default). ``auto``: bfloat16 with oneDNN-packed projections
    on a CPU with native bfloat16 arithmetic, AMX tiles or AVX512-BF16; float32 packed elsewhere
    (about 2x faster per depth than bfloat16 ``nn.Linear``); bfloat16 where nothing packs.
    Measured, one thread: on the Intel Xeon dev VM (AMX) the head's seven projections at
    1 / 4 / 8 / 32 rows take 1.9 / 1.8 / 1.8 / 3.6 ms against 3.8 / 4.1 / 5.0 / 10.4 ms packed
    float32; on the AMD EPYC VM (AVX512-BF16, no AMX) the projections and draft logits with cold
    caches take 1.8 / 1.6 / 1.9 ms at 1 / 4 / 8 rows against 2.9 / 2.5 / 3.1 ms, and ECHO at
    batch 1 ran 3-5% faster in every lockstep round (docs/bench/2026-12-04/draft-bf16).

    The drafter's dtype never changes the output: every draft token is verified by the target,
    and sampled acceptance uses the same ``q`` that drew the token. It moves only which tokens
    are proposed (and so the mean accepted length)."""
    choice = os.environ.get("ECHO_DRAFT_DTYPE", "auto")
    if choice in DRAFT_DTYPES:
        return DRAFT_DTYPES[choice]
    if choice != "auto":
        raise ValueError(f"ECHO_DRAFT_DTYPE must be auto, float32 or bfloat16, got {choice!r}")
    native = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    if native and packing_available(torch.zeros(1, 1, dtype=torch.bfloat16), allow_bf16=True):
        return torch.bfloat16
    probe = torch.zeros(1, 1, dtype=torch.float32)
    return torch.float32 if packing_available(probe) else torch.bfloat16


@dataclass(frozen=True, slots=True)
class _Rows:
    """The rows one ``observe`` call queued, for every request at once: each request's pending
    chunk is a range of them, so a step queues its rows with no tensor op per request (a
    request's chunk keeps the whole step's rows alive until it runs or the request ends)."""

    feats: Tensor  # [R, H (+ L*H)] target features in the drafter dtype
    following: Tensor  # [R] int64, x_{t+1}
    positions: Tensor  # [R] int64


@dataclass(slots=True)
class _Context:
    """The head's cache over one request's committed rows, and rows not run yet."""

    k: Tensor  # [capacity, Hkv, D] in the drafter dtype
    v: Tensor  # [capacity, Hkv, D]
    length: int = 0
    root_pos: int = 0  # position of the root token (= of the last head row)
    root_feature: Tensor | None = None  # [H] the last row's predicted feature
    root_logprob: Tensor | None = None  # [V_d], computed when the root is first expanded
    pending: list[tuple[_Rows, int, int]] = field(default_factory=list)  # (rows, lo, hi)
    pending_rows: int = 0  # rows in ``pending``

    def append(self, k: Tensor, v: Tensor) -> None:
        need = self.length + k.shape[0]
        if need > self.k.shape[0]:
            cap = max(need, 2 * self.k.shape[0])
            self.k = torch.cat(
                [self.k[: self.length], k.new_empty(cap - self.length, *k.shape[1:])]
            )
            self.v = torch.cat(
                [self.v[: self.length], v.new_empty(cap - self.length, *v.shape[1:])]
            )
        self.k[self.length : need] = k
        self.v[self.length : need] = v
        self.length = need


@dataclass(frozen=True, slots=True)
class _Node:
    rows: tuple[int, ...]  # tree rows of its ancestors-or-self (depth order)
    feature: Tensor  # [H] its row's output
    logprob: Tensor  # [V_d] log q of its children


@dataclass(slots=True)
class _Tree:
    k: list[Tensor] = field(default_factory=list)  # rows [Hkv, D]
    v: list[Tensor] = field(default_factory=list)
    nodes: dict[tuple[int, ...], _Node] = field(default_factory=dict)


def _keep_last(ctx: _Context, rows: int) -> None:
    """Drop the oldest queued rows of ``ctx`` until ``rows`` remain."""
    drop = ctx.pending_rows - rows
    while drop > 0:
        queued, lo, hi = ctx.pending[0]
        if hi - lo <= drop:
            ctx.pending.pop(0)
            drop -= hi - lo
        else:
            ctx.pending[0] = (queued, lo + drop, hi)
            drop = 0
    ctx.pending_rows = rows


def tree_mask(
    context: int,
    tree_rows: int,
    ancestors: Sequence[Sequence[int]],
    device: torch.device | str = "cpu",
) -> Tensor:
    """[M, context + tree_rows + M] bool: query m (a new node) sees the whole context, the tree
    rows of its ancestors and itself (new row m). Example: context 2, tree row 0 = parent of the
    single new node: ``[[1, 1, 1, 1]]``."""
    m = len(ancestors)
    mask = torch.zeros(m, context + tree_rows + m, dtype=torch.bool, device=device)
    mask[:, :context] = True
    for i, rows in enumerate(ancestors):
        mask[i, [context + r for r in rows]] = True
        mask[i, context + tree_rows + i] = True
    return mask


class EagleDrafter:
    """Drafter over an attached :class:`EagleHead` (module docstring)."""

    name = "eagle"

    def __init__(
        self,
        head: EagleHead,
        dtype: torch.dtype = torch.float32,
        max_pending: int = MAX_PENDING,
        prompt_window: int | None = None,
    ) -> None:
        """``head`` is moved to ``dtype`` in place (log-probs are computed in float32). On a CPU
        with oneDNN its projections are packed in either dtype (:func:`default_draft_dtype`
        says which is faster where). ``max_pending``: a
        request with that many committed rows queued has them run at once (memory bound).
        ``prompt_window``: a request whose head has run no row yet keeps only its last
        ``prompt_window`` queued rows (the head's context then starts there, a long prompt costs
        the head at most that many rows); None keeps them all."""
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        if prompt_window is not None and prompt_window < 1:
            raise ValueError(f"prompt_window must be >= 1 or None, got {prompt_window}")
        if not head.attached:
            raise ValueError("the head has no target rows: call head.attach_target first")
        shared = head.embed  # the target's embedding: kept shared (and float32), not copied
        self.head = head.to(dtype).eval()
        self.head.embed = shared
        self.device = next(self.head.parameters()).device  # the head's: every tensor lives here
        self.head.pack_for_inference()
        self.aux_layers: tuple[int, ...] = head.config.aux_layers
        self.dtype = dtype
        self.max_pending = max_pending
        self.prompt_window = prompt_window
        self._ctx: dict[str, _Context] = {}
        self._active: list[_Context | None] = []
        self._trees: list[_Tree] = []

    # -- committed rows -----------------------------------------------------------------------

    @torch.inference_mode()
    def observe(self, feedback: TargetFeedback) -> None:
        """Queue the committed rows (rows from position 0 start a new context); a request with
        ``max_pending`` rows queued runs them at once, every other request when its root is next
        expanded (module docstring: deferred catch-up)."""
        cu = feedback.cu_rows.tolist()
        if cu[-1] == 0:
            return
        dev = self.device
        tokens = feedback.tokens.to(dev)
        positions = feedback.positions.to(dev)
        if positions.data_ptr() == feedback.positions.data_ptr():
            positions = positions.clone()  # kept past this call: not the engine's tensor
        nxt = feedback.next_token.to(dev)
        following = torch.cat([tokens[1:], tokens[:1]])  # x_{t+1} inside each request's rows
        last = torch.tensor(cu[1:], dtype=torch.int64, device=dev) - 1
        live = torch.diff(torch.tensor(cu, device=dev)) > 0
        following[last[live]] = nxt[live]
        aux = self._aux(feedback)
        feats = feedback.hidden.to(dev, self.dtype)
        if aux is not None:
            feats = torch.cat([feats, aux], dim=-1)
        elif feats.data_ptr() == feedback.hidden.data_ptr():
            feats = feats.clone()
        queued = _Rows(feats, following, positions)
        firsts = [cu[b] for b in range(len(feedback.request_ids)) if cu[b] < cu[b + 1]]
        starts = iter(positions[firsts].tolist())  # one host copy for every request
        now: list[_Context] = []
        for b, rid in enumerate(feedback.request_ids):
            lo, hi = cu[b], cu[b + 1]
            if lo == hi:
                continue
            ctx, start = self._ctx.get(rid), next(starts)
            if ctx is None or start == 0:
                ctx = self._ctx[rid] = self._empty_context()
            ctx.pending.append((queued, lo, hi))
            ctx.pending_rows += hi - lo
            ctx.root_feature = ctx.root_logprob = None  # stale until the rows are run
            window = self.prompt_window
            if window is not None and ctx.length == 0 and ctx.pending_rows > window:
                _keep_last(ctx, window)
            if ctx.pending_rows >= self.max_pending:
                now.append(ctx)
        self._catch_up(now)

    def _empty_context(self) -> _Context:
        c = self.head.config
        empty = torch.empty(0, c.num_kv_heads, c.head_dim, dtype=self.dtype, device=self.device)
        return _Context(empty, empty.clone())

    def _catch_up(self, contexts: Sequence[_Context]) -> None:
        """Run every queued row of ``contexts`` (distinct) through the head in one batched pass:
        their K/V join the cache, and each request's last row gives its root feature."""
        ctxs = [c for c in contexts if c.pending]
        if not ctxs:
            return
        chunks = [chunk for ctx in ctxs for chunk in ctx.pending]
        feats = torch.cat([rows.feats[lo:hi] for rows, lo, hi in chunks])
        following = torch.cat([rows.following[lo:hi] for rows, lo, hi in chunks])
        positions = torch.cat([rows.positions[lo:hi] for rows, lo, hi in chunks])
        head, h = self.head, self.head.config.hidden_size
        aux = feats[:, h:] if self.aux_layers else None
        x = head.fuse(feats[:, :h], following, aux)
        q, k, v = head.project(x, positions + 1)
        attn = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
        dev, lo, lasts = self.device, 0, []
        for ctx in ctxs:
            n, c = ctx.pending_rows, ctx.length
            hi = lo + n
            ctx.append(k[lo:hi], v[lo:hi])
            mask = torch.ones(n, c + n, dtype=torch.bool, device=dev)
            mask[:, c:] = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
            attn[lo:hi] = self._attend(q[lo:hi], ctx.k[: c + n], ctx.v[: c + n], mask)
            last_rows, _, last_hi = ctx.pending[-1]
            ctx.root_pos = int(last_rows.positions[last_hi - 1]) + 1
            ctx.pending, ctx.pending_rows = [], 0
            lasts.append(hi - 1)
            lo = hi
        rows = torch.tensor(lasts, dtype=torch.int64, device=dev)
        out = head.finish(x[rows], attn[rows])
        for i, ctx in enumerate(ctxs):
            ctx.root_feature, ctx.root_logprob = out[i], None

    def _root_logprobs(self, contexts: Sequence[_Context]) -> None:
        """``log q`` of the token after the root for ``contexts`` lacking it (one batched pass)."""
        todo = [c for c in contexts if c.root_logprob is None and c.root_feature is not None]
        if not todo:
            return
        feats = torch.stack([c.root_feature for c in todo if c.root_feature is not None])
        logprob = torch.log_softmax(self.head.logits(feats).float(), dim=-1)
        for c, lp in zip(todo, logprob, strict=True):
            c.root_logprob = lp

    def _aux(self, feedback: TargetFeedback) -> Tensor | None:
        """The head's aux features [R, L*H] from ``feedback`` (None for a single-feature head)."""
        if not self.aux_layers:
            return None
        if len(feedback.aux) != len(self.aux_layers):
            raise ValueError(
                f"the head reads target layers {list(self.aux_layers)} but the engine sent "
                f"{len(feedback.aux)} aux features"
            )
        return torch.cat([a.to(self.device, self.dtype) for a in feedback.aux], dim=-1)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """q [M, Hq, D], k/v [L, Hkv, D], mask [M, L] -> [M, Hq * D]."""
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, enable_gqa=True
        )  # [Hq, M, D]
        return out.transpose(0, 1).reshape(q.shape[0], -1)

    # -- the step ------------------------------------------------------------------------------

    def begin_step(self, contexts: Sequence[Sequence[int]], request_ids: Sequence[str]) -> None:
        self._active = [self._ctx.get(rid) for rid in request_ids]
        self._trees = [_Tree() for _ in request_ids]

    @torch.inference_mode()
    def expand(self, nodes: ExpandRequest) -> Proposals:
        requests = nodes.request.tolist()
        logprobs: list[Tensor | None] = [None] * len(requests)
        todo: list[int] = []
        rooted = sorted({b for m, b in enumerate(requests) if not nodes.path[m]})
        roots = [c for c in (self._active[b] for b in rooted) if c is not None]
        self._catch_up(roots)  # their queued rows, batched
        self._root_logprobs(roots)
        for m, b in enumerate(requests):
            ctx, path = self._active[b], tuple(nodes.path[m])
            if ctx is None or ctx.root_feature is None:
                continue
            if not path:
                logprobs[m] = ctx.root_logprob
            elif path in self._trees[b].nodes:
                logprobs[m] = self._trees[b].nodes[path].logprob
            else:
                todo.append(m)
        if todo:
            for m, lp in zip(todo, self._run_nodes(nodes, todo), strict=True):
                logprobs[m] = lp
        return self._proposals(logprobs, nodes.topk.tolist())

    def _run_nodes(self, nodes: ExpandRequest, todo: list[int]) -> list[Tensor]:
        """Run the rows of nodes ``todo`` (one batched pass), register them, return log q."""
        head = self.head
        feats, toks, pos, parents = [], [], [], []
        for m in todo:
            b, path = int(nodes.request[m]), tuple(nodes.path[m])
            ctx = self._active[b]
            assert ctx is not None
            assert ctx.root_feature is not None
            parent = self._trees[b].nodes.get(path[:-1]) if len(path) > 1 else None
            if len(path) > 1 and parent is None:
                raise ValueError(f"node {list(path)} expanded before its parent")
            feats.append(ctx.root_feature if parent is None else parent.feature)
            parents.append(() if parent is None else parent.rows)
            toks.append(path[-1])
            pos.append(ctx.root_pos + len(path))
        dev = self.device
        x = head.fuse(torch.stack(feats), torch.tensor(toks, dtype=torch.int64, device=dev))
        q, k, v = head.project(x, torch.tensor(pos, dtype=torch.int64, device=dev))
        attn = q.new_empty(len(todo), q.shape[1] * q.shape[2])
        by_request: dict[int, list[int]] = {}
        for i, m in enumerate(todo):
            by_request.setdefault(int(nodes.request[m]), []).append(i)
        for b, idx in by_request.items():
            ctx, tree = self._active[b], self._trees[b]
            assert ctx is not None
            keys = [ctx.k[: ctx.length], *(r[None] for r in tree.k), k[idx]]
            vals = [ctx.v[: ctx.length], *(r[None] for r in tree.v), v[idx]]
            mask = tree_mask(ctx.length, len(tree.k), [parents[i] for i in idx], dev)
            attn[idx] = self._attend(q[idx], torch.cat(keys), torch.cat(vals), mask)
        out = head.finish(x, attn)
        logprob = torch.log_softmax(head.logits(out).float(), dim=-1)
        for i, m in enumerate(todo):
            b, path = int(nodes.request[m]), tuple(nodes.path[m])
            tree = self._trees[b]
            row = len(tree.k)
            tree.k.append(k[i])
            tree.v.append(v[i])
            tree.nodes[path] = _Node((*parents[i], row), out[i], logprob[i])
        return list(logprob)

    def _proposals(self, logprobs: Sequence[Tensor | None], topk: Sequence[int]) -> Proposals:
        have = [m for m, lp in enumerate(logprobs) if lp is not None]
        if not have:
            return Proposals.empty(self.device)
        stacked = torch.stack([lp for lp in logprobs if lp is not None])
        dev = self.device
        ks = torch.tensor([topk[m] for m in have], dtype=torch.int64, device=dev)
        ks = ks.clamp(max=stacked.shape[1])
        values, index = torch.topk(stacked, int(ks.max()), dim=-1)
        keep = torch.arange(values.shape[1], device=dev)[None, :] < ks[:, None]
        source = torch.tensor(have, dtype=torch.int64, device=dev)[:, None].expand_as(values)
        return Proposals(
            source=source[keep],
            token=self.head.target_ids(index[keep]),
            logprob=values[keep].float(),
        )

    def release(self, request_id: str) -> None:
        self._ctx.pop(request_id, None)  # queued rows go with it, never run


def eagle_drafter_for(
    model: LlamaModel, head_path: str | Path | None = None, dtype: torch.dtype | None = DRAFT_DTYPE
) -> EagleDrafter:
    """An :class:`EagleDrafter` over ``head_path`` (default: the shipped SmolLM2-135M head),
    attached to ``model``'s embedding and lm_head; HeadCheckpointError if it does not fit."""
    head = load_head(head_path or DEFAULT_HEAD, model.weights.embed, model.weights.lm_head)
    return EagleDrafter(head, dtype or default_draft_dtype())
