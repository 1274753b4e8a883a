"""Ragged tree attention vs padded attention, measured side by side in one run.

For each shape (a batch of requests with ragged cached prefixes and ragged draft trees) it
times, on the same inputs:

- ``ragged``: :func:`echo_kernels.tree_attention` (Triton on CUDA, the torch reference on CPU);
- ``padded``: one batched ``scaled_dot_product_attention`` over every request padded to the
  longest prefix and the largest tree, with an explicit boolean mask (K/V already laid out
  padded, as a padded KV cache would hold them: the gather is not timed);
- ``loop`` (CUDA only): the torch reference, i.e. one SDPA per request.

and prints the ratios (> 1: ragged is faster), plus on CUDA the achieved bandwidth and FLOP/s
of the ragged kernel against H200 peaks. Outputs are cross-checked before timing.

Usage: python scripts/bench_tree_attention.py [--device cpu|cuda] [--dtype D] [--repeats N]
       [--threads T]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from echo_kernels import ATTENTION_TOLERANCES, tree_attention, verify_metadata
from echo_kernels.attention_metadata import TreeAttentionMetadata
from echo_kernels.testing import random_pool, random_rows, random_tree_of_sizes
from echo_kernels.tree_attention_reference import visible_keys

H200_BYTES_PER_S = 4.8e12  # HBM3e
H200_BF16_FLOPS = 989e12  # dense tensor-core peak


@dataclass(frozen=True)
class Shape:
    name: str
    heads: tuple[int, int]  # (query heads, KV heads)
    head_dim: int
    cache_len: list[int]
    tree_sizes: list[int]


def ragged(
    batch: int, ctx: tuple[int, int], nodes: tuple[int, int], seed: int
) -> tuple[list[int], list[int]]:
    """Per request: cached length uniform in ``ctx``, tree size uniform in ``nodes``."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(ctx[0], ctx[1] + 1, (batch,), generator=g).tolist()
    sizes = torch.randint(nodes[0], nodes[1] + 1, (batch,), generator=g).tolist()
    return lens, sizes


def cpu_shapes() -> list[Shape]:
    smol = ((9, 3), 64)  # SmolLM2-135M
    shapes = []
    for batch in (1, 4, 8):
        lens, sizes = ragged(batch, (64, 256), (0, 16), batch)
        shapes.append(Shape(f"smollm2 B={batch} ragged", *smol, lens, sizes))
    skew = [64] + [2] * 7  # one big tree: padding makes everyone pay for it
    shapes.append(Shape("smollm2 B=8 one 64-node tree", *smol, [256] * 8, skew))
    return shapes


def gpu_shapes() -> list[Shape]:
    llama = ((32, 8), 128)  # Llama-3.1-8B
    shapes = []
    for batch, ctx in ((1, 8192), (16, 2048), (64, 2048), (64, 8192), (256, 512), (256, 4096)):
        lens, sizes = ragged(batch, (ctx // 2, ctx), (1, 64), batch + ctx)
        shapes.append(Shape(f"llama8b B={batch} ctx<={ctx}", *llama, lens, sizes))
    return shapes


def padded_inputs(
    q: Tensor, k_new: Tensor, v_new: Tensor, k_pool: Tensor, v_pool: Tensor,
    meta: TreeAttentionMetadata,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(q [B, Hq, T, D], k [B, Hkv, C+T, D], v, mask [B, 1, T, C+T]) padded to the largest."""
    b, t, c = meta.batch_size, meta.max_rows, int(meta.cache_len.max())
    hq, hkv, d = q.shape[1], k_new.shape[1], q.shape[2]
    qp = q.new_zeros(b, hq, t, d)
    kp, vp = q.new_zeros(b, hkv, c + t, d), q.new_zeros(b, hkv, c + t, d)
    mask = torch.zeros(b, 1, t, c + t, dtype=torch.bool, device=q.device)
    mask[:, :, :, 0] = True  # padding rows see one key: no NaN (their output is dropped)
    for i in range(b):
        lo, hi, cached = int(meta.cu_rows[i]), int(meta.cu_rows[i + 1]), int(meta.cache_len[i])
        n = hi - lo
        slots = meta.req_to_slot[i, :cached]
        qp[i, :, :n] = q[lo:hi].transpose(0, 1)
        kp[i, :, :cached], vp[i, :, :cached] = (
            k_pool[slots].transpose(0, 1),
            v_pool[slots].transpose(0, 1),
        )
        kp[i, :, c : c + n], vp[i, :, c : c + n] = (
            k_new[lo:hi].transpose(0, 1),
            v_new[lo:hi].transpose(0, 1),
        )
        vis = visible_keys(meta, i, None)
        mask[i, 0, :n] = False
        mask[i, 0, :n, :cached] = vis[:, :cached]
        mask[i, 0, :n, c : c + n] = vis[:, cached:]
    return qp, kp, vp, mask


def unpad(out: Tensor, meta: TreeAttentionMetadata) -> Tensor:  # [B, Hq, T, D] -> [R, Hq, D]
    parts = []
    for i in range(meta.batch_size):
        n = int(meta.cu_rows[i + 1] - meta.cu_rows[i])
        parts.append(out[i, :, :n].transpose(0, 1))
    return torch.cat(parts)


def timed(fn: Callable[[], Tensor], device: torch.device, repeats: int) -> float:
    """Median wall seconds per call, host overhead (validation, launch) included."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def work(meta: TreeAttentionMetadata, hq: int, hkv: int, d: int, elem: int) -> tuple[float, float]:
    """(bytes, FLOPs) of the ragged computation: K/V read once per KV head, q/out once."""
    counts = meta.cu_rows[1:] - meta.cu_rows[:-1]
    keys = float((meta.cache_len + counts).sum())
    rows = float(counts.sum())
    nbytes = (2 * keys * hkv * d + 2 * rows * hq * d) * elem
    flops = 4.0 * float((counts * (meta.cache_len + counts)).sum()) * hq * d  # upper bound
    return nbytes, flops


def run(shape: Shape, device: torch.device, dtype: torch.dtype, repeats: int) -> None:
    (hq, hkv), d = shape.heads, shape.head_dim
    tree = random_tree_of_sizes(torch.Generator().manual_seed(0), shape.tree_sizes).to(device)
    g = torch.Generator(device).manual_seed(1)
    r = tree.batch_size + tree.num_nodes
    pool = random_pool(g, shape.cache_len, r, hkv, d, dtype)
    rows = random_rows(g, r, hq, hkv, d, dtype)
    meta = verify_metadata(tree, pool.cache_len, pool.req_to_slot)
    args = (rows.q, rows.k_new, rows.v_new, pool.k_pool, pool.v_pool, meta)
    qp, kp, vp, mask = padded_inputs(*args)

    def padded() -> Tensor:
        return F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, enable_gqa=hq != hkv)

    fast = tree_attention(*args)
    tol = ATTENTION_TOLERANCES[dtype]
    torch.testing.assert_close(
        unpad(padded(), meta).float(), fast.float(), atol=tol.atol * 4, rtol=tol.rtol * 4
    )
    t_ragged = timed(lambda: tree_attention(*args), device, repeats)
    t_padded = timed(padded, device, repeats)
    line = (
        f"{shape.name:34s} rows={r:6d} keys={int(meta.cache_len.sum()) + r:8d}  "
        f"ragged {t_ragged * 1e3:8.3f} ms  padded {t_padded * 1e3:8.3f} ms  "
        f"padded/ragged {t_padded / t_ragged:6.2f}x"
    )
    if device.type == "cuda":
        t_loop = timed(lambda: tree_attention(*args, backend="torch"), device, max(1, repeats // 5))
        nbytes, flops = work(meta, hq, hkv, d, rows.q.element_size())
        bandwidth, throughput = nbytes / t_ragged, flops / t_ragged
        line += (
            f"  loop {t_loop * 1e3:8.2f} ms  loop/ragged {t_loop / t_ragged:6.1f}x"
            f"  {bandwidth / 1e12:5.2f} TB/s ({100 * bandwidth / H200_BYTES_PER_S:4.1f}% peak)"
            f"  {throughput / 1e12:6.1f} TFLOP/s ({100 * throughput / H200_BF16_FLOPS:4.1f}% peak)"
        )
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    default_dtype = "bfloat16" if device.type == "cuda" else "float32"
    dtype = getattr(torch, args.dtype or default_dtype)
    repeats = args.repeats or (20 if device.type == "cuda" else 5)
    shapes = gpu_shapes() if device.type == "cuda" else cpu_shapes()
    print(
        f"device={device} dtype={dtype} repeats={repeats} threads={torch.get_num_threads()} "
        f"torch={torch.__version__}"
    )
    for shape in shapes:
        run(shape, device, dtype, repeats)


if __name__ == "__main__":
    main()
