"""Session 16 A/B: the forward's attention with the boolean mask repeated and converted per layer
(the code before, inlined here as `per_layer`) against the additive mask built once per plan
(`TorchAttention`, DensePlan.sdpa_mask). Batch 8, the embedded model's 30 layers and head shapes,
contexts 150-450 (bench_grouped_attention's batches), both dense; 15 rounds, order rotated.

    .venv/bin/python docs/bench/2026-12-03/attention-mask/ab.py
"""

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "packages/echo-server/scripts"))
import bench_grouped_attention as g

from echo_server.bench.intervals import cpu_name, rotated, round_ratio
from echo_server.cli import build_parser
from echo_server.cli.options import load
from echo_server.model.torch_attention import TorchAttention


def per_layer(plan, q, k_cache, v_cache, scale):  # the attend before session 16
    b, w = plan.batch_size, plan.max_rows
    heads, dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    if plan.row_req is None:
        q_dense = q.view(b, w, heads, dim)
    else:
        q_dense = q.new_zeros(b, w, heads, dim)
        q_dense[plan.row_req, plan.row_local] = q
    q_grouped = (
        q_dense.view(b, w, kv_heads, group, dim)
        .permute(0, 2, 3, 1, 4)
        .reshape(b, kv_heads, group * w, dim)
    )
    flat = plan.kv_index.reshape(-1)
    c = plan.kv_index.shape[1]
    k = torch.index_select(k_cache, 0, flat).view(b, c, kv_heads, dim).transpose(1, 2)
    v = torch.index_select(v_cache, 0, flat).view(b, c, kv_heads, dim).transpose(1, 2)
    mask = None if plan.mask is None else plan.mask.repeat(1, 1, group, 1)
    out = F.scaled_dot_product_attention(q_grouped, k, v, attn_mask=mask, scale=scale)
    out = out.view(b, kv_heads, group, w, dim).permute(0, 3, 1, 2, 4).reshape(b, w, heads, dim)
    if plan.row_req is None:
        return out.reshape(b * w, heads, dim)
    return out[plan.row_req, plan.row_local]


def before(batch, q, k, v):
    plan = arm.plan(batch)
    return [per_layer(plan, q, k, v, scale) for _ in range(cfg.num_layers)][-1]


def after(batch, q, k, v):
    plan = arm.plan(batch)
    return [arm.attend(plan, q, q, q, k, v, scale) for _ in range(cfg.num_layers)][-1]


PATTERNS = {
    "decode (all 1)": [1] * 8,
    "one node each": [2] * 8,
    "ragged 1-3": [1, 1, 1, 2, 2, 3, 3, 3],
    "one tree of 5": [1] * 7 + [5],
    "all trees of 3": [3] * 8,
}
torch.set_num_threads(1)
cfg = load(build_parser().parse_args(["demo"])).model.config
scale = cfg.head_dim**-0.5
arm = TorchAttention(group_rows=False)
print(f"cpu {cpu_name()}, 1 torch thread, batch 8, {cfg.num_layers} layers, 15 rounds")
print("| rows per request | per-layer mask ms | mask once ms | before / after [95% CI] | same |")
print("|---|---:|---:|---|---|")
for name, rows in PATTERNS.items():
    gen = torch.Generator().manual_seed(1)
    batch = g._batch(rows, gen)
    n, slots = sum(rows), int(batch.slot_table.max()) + 1
    q = torch.randn(n, cfg.num_heads, cfg.head_dim, generator=gen)
    k = torch.randn(slots, cfg.num_kv_heads, cfg.head_dim, generator=gen)
    v = torch.randn(slots, cfg.num_kv_heads, cfg.head_dim, generator=gen)

    arms = {"before": before, "after": after}
    args = (batch, q, k, v)
    same = torch.equal(before(*args), after(*args))
    t = {a: [] for a in arms}
    for r in range(15):
        for a in rotated(list(arms), r):
            s = time.perf_counter()
            arms[a](*args)
            t[a].append(time.perf_counter() - s)
    rr = round_ratio([x / y for x, y in zip(t["before"], t["after"], strict=True)])
    med = {a: sorted(x)[7] * 1e3 for a, x in t.items()}
    print(
        f"| {name} {rows} | {med['before']:.1f} | {med['after']:.1f} | "
        f"{rr.ratio:.2f} [{rr.ci95[0]:.2f}, {rr.ci95[1]:.2f}] | {same} |"
    )
