"""Session 18: does a ragged selection of draft rows cost the CPU attention more than an even one
with the same row count? Two arms of the engine's TorchAttention: `dense` (every request's
queries padded to the widest request's rows) and `engine` (the default: one-row requests planned
apart from the others when that more than halves the padded rows, `split_roots`). The embedded
model's 30 layers and head shapes, batch 32, contexts 150-450 (bench_grouped_attention's
batches); 9 rounds, order rotated. Prints the median ms of the forward's attention (all layers)
per shape and arm, and each shape's cost per draft row beyond decode (rows - 32).

    .venv/bin/python docs/bench/2026-12-04/shape/shape.py
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "packages/echo-server/scripts"))
import bench_grouped_attention as g

from echo_server.bench.intervals import cpu_name, rotated
from echo_server.cli import build_parser
from echo_server.cli.options import load
from echo_server.model.torch_attention import TorchAttention

SHAPES = {
    "decode [1 x 32]": [1] * 32,
    "even, 13 rows [2 x 13, 1 x 19]": [2] * 13 + [1] * 19,
    "ragged, 13 rows [3 x 6, 2 x 1, 1 x 25]": [3] * 6 + [2] + [1] * 25,
    "even, 32 rows [2 x 32]": [2] * 32,
    "ragged, 32 rows [3 x 16, 1 x 16]": [3] * 16 + [1] * 16,
}
torch.set_num_threads(1)
cfg = load(build_parser().parse_args(["demo"])).model.config
scale = cfg.head_dim**-0.5
ARMS = {"dense": TorchAttention(group_rows=False), "engine": TorchAttention(group_rows=True)}
inputs = {}
for name, rows in SHAPES.items():
    gen = torch.Generator().manual_seed(1)
    batch = g._batch(rows, gen)
    n, slots = sum(rows), int(batch.slot_table.max()) + 1
    q = torch.randn(n, cfg.num_heads, cfg.head_dim, generator=gen)
    k = torch.randn(slots, cfg.num_kv_heads, cfg.head_dim, generator=gen)
    v = torch.randn(slots, cfg.num_kv_heads, cfg.head_dim, generator=gen)
    inputs[name] = (batch, q, k, v)


def forward(key):
    arm_name, name = key
    arm = ARMS[arm_name]
    batch, q, k, v = inputs[name]
    plan = arm.plan(batch)
    return [arm.attend(plan, q, q, q, k, v, scale) for _ in range(cfg.num_layers)][-1]


keys = [(a, name) for name in SHAPES for a in ARMS]
t = {key: [] for key in keys}
for r in range(9):
    for key in rotated(keys, r):
        s = time.perf_counter()
        forward(key)
        t[key].append(time.perf_counter() - s)
med = {key: sorted(x)[4] * 1e3 for key, x in t.items()}
print(f"cpu {cpu_name()}, 1 torch thread, batch 32, {cfg.num_layers} layers, 9 rounds")
print(
    "| rows per request | arm | split? | attention ms (median) | ms per draft row beyond decode |"
)
print("|---|---|---|---:|---:|")
for name, rows in SHAPES.items():
    extra = sum(rows) - len(rows)
    for a, arm in ARMS.items():
        base = med[(a, "decode [1 x 32]")]
        per = f"{(med[(a, name)] - base) / extra:.2f}" if extra else "-"
        split = "yes" if type(arm.plan(inputs[name][0])).__name__ == "GroupedPlan" else "no"
        print(f"| {name} | {a} | {split} | {med[(a, name)]:.1f} | {per} |")
