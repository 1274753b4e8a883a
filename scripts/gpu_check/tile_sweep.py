"""Tile sweep of echo-kernels' Triton tree attention on uniform and skewed row spreads.

The cost profile (:mod:`gpu_check.cost_profile`, part ``cost-triton``) found that at the same
total rows a skewed spread (half the requests verifying 1 row, half ``2 r - 1``) costs up to 25%
more than a uniform one at B = 256. The launch's tiles depend on the widest request
(:func:`echo_kernels.tree_attention.attention_config`: ``BLOCK_M`` = rows x group rounded up to a
power of two in 16..64), so a skewed batch gets larger M tiles for every request. This part
times one layer's attention (Llama-3.1-8B heads: 32 query, 8 KV, head dim 128, bf16) for every
tile choice in :data:`TILES` (``BLOCK_M`` 16/32/64 x ``BLOCK_N`` 32/64 x ``num_warps`` 4/8, and
16-key tiles) on each shape, and reports the default's time next to the best; every output is
checked against the default launcher's. A timed sample is ``INNER`` launches back to back
between two CUDA events, divided by ``INNER``, so the launcher's host time hides behind the
queued kernels (the first run, 2026-12-04, timed single launches: differences under ~0.02 ms
on the 0.1 ms B = 16 kernels were inside that overhead).
"""

from __future__ import annotations

import functools
import itertools
import time
from typing import Any

import torch
from gpu_check.attention_bench import median_ms

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
GPU_SHAPES = (
    # (name, batch, context, rows per request)
    *((f"uniform r={r}", 256, 1024, (r,) * 256) for r in (1, 2, 3, 4, 8)),
    *((f"skewed r={r}", 256, 1024, (1, 2 * r - 1) * 128) for r in (2, 3, 4, 8)),
    ("uniform r=4", 16, 2048, (4,) * 16),
    ("skewed r=4", 16, 2048, (1, 7) * 8),
    ("uniform r=4", 1, 8192, (4,)),
)
CPU_SHAPES = (("uniform r=2", 2, 16, (2, 2)), ("skewed r=2", 2, 16, (1, 3)))
TILES = (*itertools.product((16, 32, 64), (32, 64), (4, 8)), (16, 16, 4), (32, 16, 4))
"""BLOCK_N = 128 needs 272 KiB of shared memory at head dim 128 in bf16 (H200: 227 KiB)."""
CPU_TILES = ((16, 32, 4), (32, 32, 4))


INNER = 10
"""Launches per timed sample (:func:`gpu_check.attention_bench.median_ms`)."""


def run_tile_sweep(
    device: torch.device, shapes: Any, tiles: Any, dtype: torch.dtype, reps: int
) -> dict[str, Any]:
    from echo_kernels import ATTENTION_TOLERANCES, tree_attention, verify_metadata
    from echo_kernels.testing import random_pool, random_rows, random_tree_of_sizes
    from echo_kernels.tree_attention import (
        AttentionConfig,
        attention_config,
        tree_attention_triton,
    )

    started = time.perf_counter()
    tol = ATTENTION_TOLERANCES[dtype]
    out = []
    for name, batch, ctx, rows in shapes:
        g = torch.Generator().manual_seed(batch * 7 + ctx)
        tree = random_tree_of_sizes(g, [r - 1 for r in rows]).to(device)
        gd = torch.Generator(device).manual_seed(0)
        total = sum(rows)
        pool = random_pool(gd, [ctx] * batch, total, KV_HEADS, HEAD_DIM, dtype)
        qr = random_rows(gd, total, HEADS, KV_HEADS, HEAD_DIM, dtype)
        meta = verify_metadata(tree, pool.cache_len, pool.req_to_slot)
        scale = HEAD_DIM**-0.5
        default = attention_config(
            dtype, HEAD_DIM, HEADS // KV_HEADS, meta.max_rows, batch * KV_HEADS
        )
        want = tree_attention(qr.q, qr.k_new, qr.v_new, pool.k_pool, pool.v_pool, meta).float()
        times: dict[str, float] = {}
        wrong: list[str] = []
        failed: dict[str, str] = {}
        own = (default.block_m, default.block_n, default.num_warps)
        for bm, bn, warps in tiles if own in tiles else (*tiles, own):
            cfg = AttentionConfig(bm, bn, default.block_d, warps)
            key = f"{bm}x{bn}w{warps}"

            fn = functools.partial(
                tree_attention_triton, qr.q, qr.k_new, qr.v_new, pool.k_pool, pool.v_pool, meta,
                scale, config=cfg,
            )  # fmt: skip

            try:
                got = fn().float()
            except Exception as err:  # tiles the device cannot run (shared memory): recorded
                failed[key] = type(err).__name__
                continue
            if not torch.allclose(got, want, atol=tol.atol, rtol=tol.rtol):
                wrong.append(key)
            times[key] = round(median_ms(fn, device, reps, INNER), 4)
        dkey = f"{default.block_m}x{default.block_n}w{default.num_warps}"
        if not times:
            out.append({"shape": name, "batch": batch, "failed": failed, "wrong": ["all"]})
            continue
        best = min(times, key=times.__getitem__)
        out.append({
            "shape": name, "batch": batch, "context": ctx, "rows": total,
            "max_rows": meta.max_rows, "default": dkey, "default_ms": times.get(dkey),
            "best": best, "best_ms": times[best], "times_ms": times, "wrong": wrong,
            "failed": failed,
        })  # fmt: skip
        if device.type == "cuda":
            del pool, qr, fn, want
            torch.cuda.empty_cache()
    return {
        "shapes": out,
        "ok": all(not s["wrong"] and s.get("default") in s.get("times_ms", {}) for s in out),
        "seconds": round(time.perf_counter() - started, 2),
    }


def format_sweep(result: dict[str, Any]) -> str:
    lines = [f"{'shape':<14} {'B':>4} {'ctx':>5} {'rows':>5} {'default':>10} {'ms':>8} "
             f"{'best':>10} {'ms':>8}"]  # fmt: skip
    for s in result["shapes"]:
        if "best" not in s:
            lines.append(f"{s['shape']:<14} {s['batch']:>4} every tile failed: {s['failed']}")
            continue
        lines.append(
            f"{s['shape']:<14} {s['batch']:>4} {s['context']:>5} {s['rows']:>5} "
            f"{s['default']:>10} {s['default_ms'] or 0:>8.4f} {s['best']:>10} {s['best_ms']:>8.4f}"
        )
    return "\n".join(lines)
