"""A measured step-cost profile of a Llama-3.1-8B-shaped target and an EAGLE-3-shaped head.

Replay (``echo-sd sim``) prices GPU steps with a roofline: weights and KV cache read at 0.8 of
the datasheet bandwidth, rows computed at 0.6 of peak FLOP/s (``echo_lab.replay.costs``).
This part measures the same two quantities on the device instead, with seeded random bf16
weights of the published shapes (timing depends on shapes, not on values), and writes them as an
``echo-cpu-cost/1`` profile that replay loads like the CPU one.

**Verify pass** at batch B, every request holding ``CONTEXT`` cached tokens and verifying r rows
(a chain: row i sees the context and rows 0..i), ``T = B r`` rows in all:

    x = embed(ids);  per layer: x += Wo attn(rope(Wqkv rmsnorm(x)));  x += Wd (silu(Wg h) * Wu h)
    ids' = argmax(Wlm rmsnorm(x))

with the new rows' K/V written into the cache. Attention is torch's SDPA over the cache with a
boolean mask (torch picks the kernel and the summary names it: cuDNN on the H200, 2026-12-04);
grouped-query attention is folded into the query length (query head h = 4 g + j reads KV head
g: q is reshaped to ``[B, 8, 4 r, 128]``), so no K/V copy. It is a stand-in for FlashInfer/FA3,
not one of them: the attention share is an upper bound. The layer is plain torch, unfused: about
40 kernels per layer (norms in float32, rotary through ``cat``, separate activation and residual
adds), which in a CUDA graph still cost a few microseconds each; at one row per request that
fixed cost is a visible share of the pass (a fused engine pays less of it).

**Draft head call** at batch B with n nodes per request: one decoder layer reading ``2 x hidden``
inputs (EAGLE-3: the token embedding and the feature), its own KV cache of ``CONTEXT`` tokens,
MLP 14,336, a 32,000-token lm_head and a top-8. The fusion layer over the target's three
features runs once per step on the roots; it is left out (12% of the head's parameters, once
per step rather than per call). Per batch size, ``t(B, n) = c_call(B) + c_node(B) B n`` is the
least-squares line through the measured n.

``attention="triton"`` (part ``cost-triton``) runs the layers' attention through echo-kernels'
ragged ``tree_attention`` over a paged pool instead (the engine's own kernel on CUDA; K/V of the
new rows read from their projections, as in the engine's verify pass), and adds **skewed**
shapes: at the same total ``T = B r``, half of the requests verify 1 row and half ``2 r - 1``
(ECHO's selections are ragged; a fixed tree's are uniform). The question they answer: does a
verify pass cost its total rows, whatever their spread?

Each shape is captured in a CUDA graph (as SGLang serves decode and verify; eager on the CPU)
and timed in ``rounds`` interleaved rounds over all shapes, ``reps`` replays per round, CUDA
events; the reported time is the median of all replays, with the spread between rounds' medians.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

CONTEXT = 1024
"""Cached tokens per request: the rooflines' mean context (echo_lab.replay.costs)."""


@dataclass(frozen=True, slots=True)
class Shapes:
    """Target and head geometry, batch sizes and rows per request of the profile."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    draft_vocab: int
    context: int
    batches: tuple[int, ...]
    rows_per_request: tuple[int, ...]
    nodes_per_request: tuple[int, ...]

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def target_params(self) -> float:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        per_layer = h * (h + 2 * kv) + h * h + 3 * h * self.intermediate
        return self.layers * per_layer + 2 * self.vocab * h  # embedding + untied lm_head


LLAMA31_8B = Shapes(
    32, 4096, 32, 8, 14336, 128256, 32000, CONTEXT,
    batches=(1, 16, 64, 128, 256),
    rows_per_request=(1, 2, 3, 4, 6, 8, 12, 16),
    nodes_per_request=(1, 2, 4, 8),
)  # fmt: skip
"""meta-llama/Llama-3.1-8B-Instruct config.json; EAGLE-3 head vocabulary 32,000."""
TINY = Shapes(
    2, 64, 4, 2, 96, 256, 64, 24,
    batches=(1, 2), rows_per_request=(1, 2, 3), nodes_per_request=(1, 2),
)  # fmt: skip
"""Dry run on the CPU: every code path at toy sizes."""


def _rmsnorm(x: Tensor, w: Tensor) -> Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding, half-split convention; ``x`` is ``[..., rows, head_dim]``."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class _Layer:
    """Weights, KV cache and static buffers of one attention + MLP block (target or head).

    The cache is ``[B, Hkv, L, D]`` for SDPA, or (``paged``) a pool ``[B L, Hkv, D]`` where
    request b's token t sits at slot ``b L + t`` (``L = context + headroom``).
    """

    def __init__(
        self, s: Shapes, in_dim: int, batch: int, gen: torch.Generator, dev: torch.device,
        dtype: torch.dtype, paged: bool = False,
    ) -> None:  # fmt: skip
        h, kv = s.hidden, s.kv_heads * s.head_dim

        def w(*shape: int) -> Tensor:
            return torch.randn(*shape, generator=gen, device=dev, dtype=dtype) * 0.02

        self.s, self.paged = s, paged
        self.wqkv, self.wo = w(h + 2 * kv, in_dim), w(h, h)
        self.wgu, self.wd = w(2 * s.intermediate, h), w(h, s.intermediate)
        self.norm1 = torch.ones(in_dim, device=dev, dtype=dtype)
        self.norm2 = torch.ones(h, device=dev, dtype=dtype)
        self.span = s.context + 2 * max(s.rows_per_request + s.nodes_per_request)
        shape = (
            (batch * self.span, s.kv_heads, s.head_dim)
            if paged
            else (batch, s.kv_heads, self.span, s.head_dim)
        )
        self.k = torch.empty(shape, device=dev, dtype=dtype).normal_(generator=gen)
        self.v = torch.empty(shape, device=dev, dtype=dtype).normal_(generator=gen)

    def __call__(self, x: Tensor, batch: int, r: int, attn: Any) -> Tensor:
        """``attn``: ``(mask, cos, sin)`` for SDPA (r rows per request), or ``(meta, cos, sin)``
        for the paged pool (any rows per request; ``cos``/``sin`` per row)."""
        s, ctx, d = self.s, self.s.context, self.s.head_dim
        g, rep = s.kv_heads, s.heads // s.kv_heads
        qkv = _rmsnorm(x, self.norm1) @ self.wqkv.T
        q, k, v = torch.split(qkv, [s.hidden, g * d, g * d], dim=-1)
        if self.paged:
            from echo_kernels import tree_attention

            meta, cos, sin = attn
            rows = x.shape[0]
            q = _rope(q.reshape(rows, s.heads, d), cos, sin).contiguous()
            k = _rope(k.reshape(rows, g, d), cos, sin).contiguous()
            v = v.reshape(rows, g, d).contiguous()
            o = tree_attention(q, k, v, self.k, self.v, meta).reshape(rows, s.hidden)
        else:
            mask, cos, sin = attn
            q = _rope(q.reshape(batch, r, s.heads, d).transpose(1, 2), cos, sin)  # [B, H, r, d]
            k = _rope(k.reshape(batch, r, g, d).transpose(1, 2), cos, sin)
            self.k[:batch, :, ctx : ctx + r] = k
            self.v[:batch, :, ctx : ctx + r] = v.reshape(batch, r, g, d).transpose(1, 2)
            q = q.reshape(batch, g, rep * r, d)  # query head g*rep + j -> KV head g (GQA folded)
            keys, values = self.k[:batch, :, : ctx + r], self.v[:batch, :, : ctx + r]
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            o = o.reshape(batch, s.heads, r, d).transpose(1, 2).reshape(batch * r, s.hidden)
        x = (x[:, : s.hidden] if x.shape[-1] != s.hidden else x) + o @ self.wo.T
        gu = _rmsnorm(x, self.norm2) @ self.wgu.T
        gate, up = gu.chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ self.wd.T


def _paged_attn(
    s: Shapes, layer: _Layer, sizes: list[int], dev: torch.device, dtype: torch.dtype
) -> tuple[Any, Tensor, Tensor]:
    """Tree metadata for requests ``0..len(sizes)-1`` with ``sizes[b]`` draft nodes each (a
    random recursive tree under each root), every request at ``context`` cached tokens, and
    per-row rotary tables ``[rows, 1, D]``."""
    from echo_kernels import verify_metadata
    from echo_kernels.testing import random_tree_of_sizes

    batch = len(sizes)
    tree = random_tree_of_sizes(torch.Generator().manual_seed(batch), sizes).to(dev)
    slots = torch.arange(batch * layer.span, device=dev).view(batch, layer.span)[:, : s.context]
    cache_len = torch.full((batch,), s.context, dtype=torch.int64, device=dev)
    meta = verify_metadata(tree, cache_len, slots.contiguous())
    cos, sin = _rotary_at(s, meta.positions, dtype)
    return meta, cos, sin


def _chain_mask(s: Shapes, r: int, dev: torch.device) -> Tensor:
    """``[1, 1, rep r, context + r]``: every row sees the context, row i the rows 0..i; the
    storage is padded to a multiple of 16 columns (the fused SDPA kernels' alignment)."""
    rep, width = s.heads // s.kv_heads, s.context + r
    padded = torch.zeros(rep * r, -(-width // 16) * 16, dtype=torch.bool, device=dev)
    padded[:, : s.context] = True
    tri = torch.ones(r, r, dtype=torch.bool, device=dev).tril()
    padded[:, s.context : width] = tri.repeat(rep, 1)
    return padded[None, None, :, :width]


def _rotary_at(s: Shapes, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Rotary tables ``[len(positions), 1, D]`` (theta 500,000, Llama-3.1's base)."""
    dev = positions.device
    inv = 1.0 / (500000.0 ** (torch.arange(0, s.head_dim, 2, device=dev) / s.head_dim))
    ang = torch.outer(positions.to(torch.float32), inv).repeat(1, 2)
    return ang.cos().to(dtype)[:, None], ang.sin().to(dtype)[:, None]


def _rotary(s: Shapes, r: int, dev: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Rotary tables ``[r, D]`` for rows at positions ``context .. context + r - 1``."""
    cos, sin = _rotary_at(s, torch.arange(s.context, s.context + r, device=dev), dtype)
    return cos[:, 0], sin[:, 0]


class _Timer:
    """A shape's forward, as a CUDA graph where the device allows (eager otherwise)."""

    def __init__(self, fn: Callable[[], Tensor], dev: torch.device, graphs: bool) -> None:
        self.fn, self.dev = fn, dev
        self.graph: torch.cuda.CUDAGraph | None = None
        self.capture_error: str | None = None
        if dev.type == "cuda" and graphs:
            stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    fn()
                self.graph = graph
            except RuntimeError as err:  # timed eagerly instead; the summary says so
                self.capture_error = repr(err)[:300]
                torch.cuda.synchronize()
        else:
            fn()

    def time_ms(self, reps: int) -> list[float]:
        out = []
        for _ in range(reps):
            if self.dev.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # ditto
                start.record()
                self.graph.replay() if self.graph is not None else self.fn()
                end.record()
                torch.cuda.synchronize()
                out.append(float(start.elapsed_time(end)))
            else:
                t0 = time.perf_counter()
                self.fn()
                out.append((time.perf_counter() - t0) * 1e3)
        return out


def _sdpa_backend(s: Shapes, batch: int, r: int, dev: torch.device, dtype: torch.dtype) -> str:
    """The SDPA kernel torch picks for the largest verify shape (``torch._fused_sdp_choice``,
    a private call: "unknown" where it is missing)."""
    names = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
    q = torch.zeros(
        batch, s.kv_heads, (s.heads // s.kv_heads) * r, s.head_dim, device=dev, dtype=dtype
    )
    k = torch.zeros(batch, s.kv_heads, s.context + r, s.head_dim, device=dev, dtype=dtype)
    try:
        choice = int(torch._fused_sdp_choice(q, k, k, attn_mask=_chain_mask(s, r, dev)))
    except (AttributeError, RuntimeError, TypeError) as err:
        return f"unknown ({err!r})"
    return names.get(choice, str(choice))


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


def run_cost_profile(
    device: torch.device, s: Shapes, dtype: torch.dtype, rounds: int, reps: int,
    graphs: bool = True, attention: str = "sdpa",
) -> dict[str, Any]:  # fmt: skip
    """Time every (B, r) verify pass and (B, n) head call; returns the profile and its spread.
    ``attention``: ``"sdpa"`` or ``"triton"`` (module docstring; the head always uses SDPA)."""
    if attention not in ("sdpa", "triton"):
        raise ValueError(f"attention must be 'sdpa' or 'triton', got {attention!r}")
    paged = attention == "triton"
    started = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(0)
    bmax = max(s.batches)
    embed = torch.randn(s.vocab, s.hidden, generator=gen, device=device, dtype=dtype) * 0.02
    lm = torch.randn(s.vocab, s.hidden, generator=gen, device=device, dtype=dtype) * 0.02
    layers = [_Layer(s, s.hidden, bmax, gen, device, dtype, paged) for _ in range(s.layers)]
    head = _Layer(s, 2 * s.hidden, bmax, gen, device, dtype)
    head_lm = torch.randn(s.draft_vocab, s.hidden, generator=gen, device=device, dtype=dtype) * 0.02
    final = torch.ones(s.hidden, device=device, dtype=dtype)
    setup_s = time.perf_counter() - started

    def verify_fn(batch: int, sizes: list[int]) -> Callable[[], Tensor]:
        """A verify pass where request b verifies its root and ``sizes[b]`` draft rows."""
        rows = batch + sum(sizes)
        ids = torch.randint(0, s.vocab, (rows,), generator=gen, device=device)
        r = 1 + sizes[0]  # SDPA: uniform sizes
        attn: Any = (
            _paged_attn(s, layers[0], sizes, device, dtype)
            if paged
            else (_chain_mask(s, r, device), *_rotary(s, r, device, dtype))
        )

        def fn() -> Tensor:
            x = embed[ids]
            for layer in layers:
                x = layer(x, batch, r, attn)
            return (_rmsnorm(x, final) @ lm.T).argmax(-1)

        return fn

    def head_fn(batch: int, n: int) -> Callable[[], Tensor]:
        feats = torch.randn(batch * n, 2 * s.hidden, generator=gen, device=device, dtype=dtype)
        attn = (_chain_mask(s, n, device), *_rotary(s, n, device, dtype))

        def fn() -> Tensor:
            x = head(feats, batch, n, attn)
            return (_rmsnorm(x, final) @ head_lm.T).topk(8, dim=-1).indices

        return fn

    shapes: dict[tuple[str, int, int], _Timer] = {}
    with torch.inference_mode():
        backend = (
            "echo_kernels.tree_attention"
            if paged
            else _sdpa_backend(s, bmax, max(s.rows_per_request), device, dtype)
        )
        for b in s.batches:
            for r in s.rows_per_request:
                shapes["verify", b, r] = _Timer(verify_fn(b, [r - 1] * b), device, graphs)
                if paged and r > 1 and b > 1:  # same total rows, half at 1 and half at 2r - 1
                    skew = [0 if i % 2 else 2 * r - 2 for i in range(b)]
                    shapes["skew", b, r] = _Timer(verify_fn(b, skew), device, graphs)
            for n in s.nodes_per_request:
                shapes["draft", b, n] = _Timer(head_fn(b, n), device, graphs)
        capture_s = time.perf_counter() - started - setup_s
        samples: dict[tuple[str, int, int], list[list[float]]] = {k: [] for k in shapes}
        keys = list(shapes)
        for i in range(rounds):  # order rotated per round
            for key in keys[i % len(keys) :] + keys[: i % len(keys)]:
                samples[key].append(shapes[key].time_ms(reps))

    def summary(key: tuple[str, int, int]) -> tuple[float, float, float]:
        flat = [t for rnd in samples[key] for t in rnd]
        per_round = [statistics.median(rnd) for rnd in samples[key]]
        return statistics.median(flat), min(per_round), max(per_round)

    verify: dict[str, Any] = {}
    draft: dict[str, Any] = {}
    for b in s.batches:
        rows = [b * r for r in s.rows_per_request]
        med = [summary(("verify", b, r)) for r in s.rows_per_request]
        mono = running_max([m[0] for m in med])
        verify[str(b)] = {
            "rows": [float(t) for t in rows],
            "seconds": [m / 1e3 for m in mono],
            "raw_ms": [round(m[0], 4) for m in med],
            "round_range_ms": [[round(m[1], 4), round(m[2], 4)] for m in med],
        }
        skewed = [summary(("skew", b, r)) for r in s.rows_per_request if ("skew", b, r) in samples]
        if skewed:
            verify[str(b)]["skewed_raw_ms"] = [round(m[0], 4) for m in skewed]
            verify[str(b)]["skewed_round_range_ms"] = [
                [round(m[1], 4), round(m[2], 4)] for m in skewed
            ]
            verify[str(b)]["skewed_rows"] = [float(b * r) for r in s.rows_per_request if r > 1]
        nodes = [b * n for n in s.nodes_per_request]
        dmed = [summary(("draft", b, n)) for n in s.nodes_per_request]
        call_ms, node_ms = _line(nodes, [m[0] for m in dmed])
        draft[str(b)] = {
            "per_call_s": max(call_ms, 0.0) / 1e3,
            "per_node_s": max(node_ms, 0.0) / 1e3,
            "nodes": nodes,
            "raw_ms": [round(m[0], 4) for m in dmed],
            "round_range_ms": [[round(m[1], 4), round(m[2], 4)] for m in dmed],
        }
    return {
        "shapes": {
            "layers": s.layers,
            "hidden": s.hidden,
            "heads": s.heads,
            "kv_heads": s.kv_heads,
            "intermediate": s.intermediate,
            "vocab": s.vocab,
            "draft_vocab": s.draft_vocab,
            "context": s.context,
            "target_params": s.target_params,
        },
        "dtype": str(dtype).removeprefix("torch."),
        "cuda_graphs": bool(shapes) and all(t.graph is not None for t in shapes.values()),
        "graphs_captured": sum(t.graph is not None for t in shapes.values()),
        "capture_errors": sorted({t.capture_error for t in shapes.values() if t.capture_error}),
        "attention": attention,
        "sdpa_backend": backend,
        "rounds": rounds,
        "reps": reps,
        "verify": verify,
        "draft_by_batch": draft,
        "setup_s": round(setup_s, 2),
        "capture_s": round(capture_s, 2),
        "wall_s": round(time.perf_counter() - started, 2),
        "ok": all(math.isfinite(x) for v in verify.values() for x in v["seconds"])
        and all(math.isfinite(d["per_call_s"] + d["per_node_s"]) for d in draft.values())
        and (
            not graphs or device.type != "cuda" or all(t.graph is not None for t in shapes.values())
        ),
    }


def running_max(xs: Sequence[float]) -> list[float]:
    """Running maximum: replay's profile needs seconds that never fall as rows grow. A dip can be
    noise or a systematic shape effect (the SDPA profile's odd r are slower than the next even
    r); the envelope lifts the faster shape after it to the dip's level, and ``raw_ms`` keeps the
    measured medians."""
    return list(itertools.accumulate(xs, max))


def as_cost_file(result: dict[str, Any], machine: dict[str, Any]) -> dict[str, Any]:
    """The ``echo-cpu-cost/1`` document for replay (:func:`echo_lab.replay.costs.
    profile_document`): verify per batch, draft per batch (the scalar ``draft`` is the smallest
    batch's, the format's required field), and how it was measured."""
    from echo_lab.replay.costs import profile_document

    draft = result["draft_by_batch"]
    first = draft[min(draft, key=int)]
    keys: tuple[str, ...] = ("shapes", "dtype", "attention", "sdpa_backend", "cuda_graphs")
    keys += ("graphs_captured", "capture_errors", "rounds", "reps")
    return profile_document(
        {int(b): (v["rows"], v["seconds"]) for b, v in result["verify"].items()},
        first["per_call_s"],
        first["per_node_s"],
        machine,
        draft_by_batch={int(b): (d["per_call_s"], d["per_node_s"]) for b, d in draft.items()},
        measurement={k: result[k] for k in keys if k in result},
    )
