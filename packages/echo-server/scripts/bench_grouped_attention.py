"""CPU attention of one forward, dense padded layout vs grouped by row count, interleaved.

A batch of 8 requests with contexts of 150-450 cached tokens and a given number of new rows each
(1 = a request verifying only its root, more = a draft tree) runs ``TorchAttention.plan`` once
and ``attend`` once per layer, with the embedded model's head shapes and layer count, on
``TorchAttention(group_rows=False)`` (every request padded to the widest tree) and on the
default (one-row requests apart from tree requests when that more than halves the padded
query rows: ``split_roots``). The two alternate, order rotated each round; per row
pattern it prints the dense/grouped time ratio (median over rounds, 95% t-interval) and checks
that both give the same output to float32 rounding.

    .venv/bin/python packages/echo-server/scripts/bench_grouped_attention.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import time

import torch

from echo_core.tolerance import float_tolerance
from echo_server.bench.intervals import cpu_name, rotated, round_ratio
from echo_server.cli import build_parser
from echo_server.cli.options import load
from echo_server.model.attention import AttentionBatch, make_batch
from echo_server.model.torch_attention import TorchAttention

PATTERNS = {
    "decode (all 1)": [1] * 8,
    "one tree of 5": [1] * 7 + [5],
    "two trees of 3": [1] * 6 + [3, 3],
    "mixed 1-6": [1, 1, 2, 2, 3, 3, 5, 6],
    "all trees of 3": [3] * 8,
}
ARMS = {"dense": TorchAttention(group_rows=False), "grouped": TorchAttention()}


def _batch(rows: list[int], gen: torch.Generator) -> AttentionBatch:
    contexts = torch.randint(150, 450, (len(rows),), generator=gen).tolist()
    width = max(c + r for c, r in zip(contexts, rows, strict=True))
    slots = sum(contexts) + sum(rows) + 1
    table = torch.zeros(len(rows), width, dtype=torch.int64)
    perm = torch.randperm(slots - 1, generator=gen) + 1
    used = 0
    for b, c in enumerate(contexts):
        table[b, :c] = perm[used : used + c]
        used += c
    write = perm[used : used + sum(rows)].clone()
    mask = torch.zeros(sum(rows), max(rows), dtype=torch.bool)
    at = 0
    for r in rows:  # a chain: row j sees rows 0..j (a tree mask costs the same)
        mask[at : at + r, :r] = torch.tril(torch.ones(r, r, dtype=torch.bool))
        at += r
    return make_batch(table, list(range(len(rows))), contexts, rows, write, mask)


def _forward(arm: TorchAttention, batch: AttentionBatch, tensors: dict[str, torch.Tensor],
             layers: int, scale: float) -> tuple[float, torch.Tensor]:  # fmt: skip
    start = time.perf_counter()
    plan = arm.plan(batch)
    out = tensors["q"]
    for _ in range(layers):
        out = arm.attend(plan, tensors["q"], tensors["k_new"], tensors["v_new"], tensors["k"],
                         tensors["v"], scale)  # fmt: skip
    return time.perf_counter() - start, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args()
    torch.set_num_threads(1)
    cfg = load(build_parser().parse_args(["demo"])).model.config
    scale = cfg.head_dim**-0.5
    print(
        f"cpu {cpu_name()}, 1 torch thread, batch 8, {cfg.num_layers} layers, heads "
        f"{cfg.num_heads}/{cfg.num_kv_heads} x {cfg.head_dim}, {a.rounds} rounds"
    )
    print("| rows per request | dense ms | grouped ms | dense / grouped [95% CI] |")
    print("|---|---:|---:|---|")
    gen = torch.Generator().manual_seed(0)
    for name, rows in PATTERNS.items():
        batch = _batch(rows, gen)
        n, slots = sum(rows), int(batch.slot_table.max()) + 1
        tensors = {
            "q": torch.randn(n, cfg.num_heads, cfg.head_dim, generator=gen),
            "k": torch.randn(slots, cfg.num_kv_heads, cfg.head_dim, generator=gen),
            "v": torch.randn(slots, cfg.num_kv_heads, cfg.head_dim, generator=gen),
        }
        tensors["k_new"], tensors["v_new"] = tensors["k"][:n], tensors["v"][:n]
        outs = {arm: _forward(ARMS[arm], batch, tensors, 1, scale)[1] for arm in ARMS}
        tol = float_tolerance(torch.float32, batch.max_context, scale=1.0)
        same = torch.allclose(outs["dense"], outs["grouped"], atol=tol, rtol=0)
        times: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for r in range(a.rounds):
            for arm in rotated(list(ARMS), r):
                times[arm].append(_forward(ARMS[arm], batch, tensors, cfg.num_layers, scale)[0])
        ratio = round_ratio([d / g for d, g in zip(times["dense"], times["grouped"], strict=True)])
        lo, hi = ratio.ci95
        med = {arm: sorted(t)[len(t) // 2] * 1e3 for arm, t in times.items()}
        print(
            f"| {name} {rows} | {med['dense']:.1f} | {med['grouped']:.1f} | "
            f"{ratio.ratio:.2f} [{lo:.2f}, {hi:.2f}] |" + ("" if same else " OUTPUTS DIFFER")
        )


if __name__ == "__main__":
    main()
