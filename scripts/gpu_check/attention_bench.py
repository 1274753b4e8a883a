"""Triton tree attention vs torch SDPA on ragged trees at Llama-3.1-8B shapes, with a speed table.

Per case (batch B, longest cached context C): request b has ``cache_len[b]`` cached tokens drawn
from ``[C/16, C]`` and a random recursive draft tree of 1-64 nodes, so the verify pass has
``R = B + N`` rows (a root per request, then its nodes). One layer of Llama-3.1-8B: 32 query heads,
8 KV heads, head dim 128, bf16.

- Triton: echo-kernels' ``tree_attention`` over the pool with ``verify_metadata`` (bit-packed
  ancestor masks, no padding).
- SDPA: echo-server's :class:`~echo_server.model.torch_attention.TorchAttention`: the same rows
  padded to ``[B, W = max rows, C' = max context]``, K/V gathered, one
  ``scaled_dot_product_attention`` with a boolean mask.

Both outputs must agree within echo-kernels' ``ATTENTION_TOLERANCES[dtype]``. Times are CUDA-event
medians of ``reps`` calls of one layer's ``attend`` after warm-up (``plan`` is timed separately:
it runs once per forward, shared by all layers); ``speedup = sdpa_ms / triton_ms``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
GPU_CASES = ((1, 8192), (16, 2048), (64, 4096), (256, 1024))
CPU_CASES = ((3, 24),)


def median_ms(fn: Callable[[], Any], device: torch.device, reps: int, inner: int = 1) -> float:
    """Median milliseconds of one call of ``fn`` over ``reps`` samples after warm-up; on CUDA a
    sample is ``inner`` calls back to back between two events, divided by ``inner`` (so a short
    kernel's launcher host time hides behind the queued ones)."""
    for _ in range(min(reps, 3)):
        fn()
    samples = []
    for _ in range(reps):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # ditto
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / inner)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return float(statistics.median(samples))


def _case(
    batch: int, max_ctx: int, device: torch.device, dtype: torch.dtype, max_nodes: int, reps: int
) -> dict[str, Any]:
    from echo_kernels import ATTENTION_TOLERANCES, tree_attention, verify_metadata
    from echo_kernels.testing import random_pool, random_rows, random_tree_of_sizes
    from echo_server.model.attention import make_batch, tree_row_mask
    from echo_server.model.torch_attention import TorchAttention

    g = torch.Generator().manual_seed(batch * 1000 + max_ctx)
    lens = torch.randint(max(max_ctx // 16, 1), max_ctx + 1, (batch,), generator=g).tolist()
    sizes = torch.randint(1, max_nodes + 1, (batch,), generator=g).tolist()
    tree = random_tree_of_sizes(g, sizes).to(device)
    rows_per_request = [1 + n for n in sizes]
    r = sum(rows_per_request)
    gd = torch.Generator(device).manual_seed(0)
    pool = random_pool(gd, lens, r, KV_HEADS, HEAD_DIM, dtype)
    rows = random_rows(gd, r, HEADS, KV_HEADS, HEAD_DIM, dtype)
    scale = HEAD_DIM**-0.5

    def plan_triton() -> Any:
        return verify_metadata(tree, pool.cache_len, pool.req_to_slot)

    meta = plan_triton()

    def run_triton() -> Tensor:
        return tree_attention(
            rows.q, rows.k_new, rows.v_new, pool.k_pool, pool.v_pool, meta, scale=scale
        )

    # SDPA reads the new rows from the pool: write them at their reserved slots.
    pool.k_pool[pool.row_slots] = rows.k_new
    pool.v_pool[pool.row_slots] = rows.v_new
    table = pool.req_to_slot.clamp(min=0)
    table = torch.cat([table, table.new_zeros(batch, max(rows_per_request))], dim=1)
    sdpa = TorchAttention()

    def plan_sdpa() -> Any:
        b = make_batch(
            table, list(range(batch)), lens, rows_per_request, pool.row_slots, tree_row_mask(tree)
        )
        return sdpa.plan(b)

    dense = plan_sdpa()

    def run_sdpa() -> Tensor:
        return sdpa.attend(dense, rows.q, rows.k_new, rows.v_new, pool.k_pool, pool.v_pool, scale)

    tol = ATTENTION_TOLERANCES[dtype]
    got, want = run_triton().float(), run_sdpa().float()
    max_err = float((got - want).abs().max())
    close = bool(torch.allclose(got, want, atol=tol.atol, rtol=tol.rtol))
    triton_ms = median_ms(run_triton, device, reps)
    sdpa_ms = median_ms(run_sdpa, device, reps)
    return {
        "batch": batch,
        "max_context": max_ctx,
        "rows": r,
        "padded_rows": batch * max(rows_per_request),
        "close": close,
        "max_abs_err": max_err,
        "atol": tol.atol,
        "triton_ms": round(triton_ms, 4),
        "sdpa_ms": round(sdpa_ms, 4),
        "speedup": round(sdpa_ms / triton_ms, 2) if triton_ms > 0 else None,
        "triton_plan_ms": round(median_ms(plan_triton, device, reps), 4),
        "sdpa_plan_ms": round(median_ms(plan_sdpa, device, reps), 4),
    }


def run_attention_bench(
    device: torch.device,
    cases: tuple[tuple[int, int], ...],
    dtype: torch.dtype,
    max_nodes: int = 64,
    reps: int = 20,
) -> dict[str, Any]:
    """Every case of ``cases`` (module docstring); ``ok`` when every case agrees."""
    start = time.perf_counter()
    table = []
    for batch, max_ctx in cases:
        table.append(_case(batch, max_ctx, device, dtype, max_nodes, reps))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {
        "device": str(device),
        "dtype": str(dtype),
        "shape": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM},
        "cases": table,
        "ok": all(row["close"] for row in table),
        "seconds": round(time.perf_counter() - start, 2),
    }


def format_table(result: dict[str, Any]) -> str:
    """The speed table as aligned text."""
    head = f"{'B':>4} {'ctx':>6} {'rows':>6} {'padded':>7} {'triton ms':>10} {'sdpa ms':>9} "
    head += f"{'speedup':>8} {'max err':>9} ok"
    lines = [head]
    for c in result["cases"]:
        lines.append(
            f"{c['batch']:>4} {c['max_context']:>6} {c['rows']:>6} {c['padded_rows']:>7} "
            f"{c['triton_ms']:>10.3f} {c['sdpa_ms']:>9.3f} {c['speedup'] or 0:>8.2f} "
            f"{c['max_abs_err']:>9.2e} {'yes' if c['close'] else 'NO'}"
        )
    return "\n".join(lines)
