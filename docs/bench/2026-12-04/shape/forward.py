"""Session 19: what a verify pass costs by the shape of its draft rows at batch 32.

The engine's own verify pass (engine/verify.py ``verify_pass``: the embedded model, its default
attention and linear paths, logits over every row) for 32 requests with cached contexts of
150-450 tokens (one fixed draw), each verifying its root plus a chain of draft rows. Shapes: the
one ECHO's floor kept at c=32 on humaneval (13 requests with one draft row), the one static K=32
verified (27 with one), 32 with one, and ragged selections of 13 and 32 rows. 21 rounds, the
shapes' order rotated each round; the median ms per pass and each shape's cost per draft row
beyond decode: the median over rounds of (pass - the same round's decode pass) / draft rows, with
a distribution-free 95% interval of that median (order statistics j and n + 1 - j, the largest
j with ``P(Bin(n, 1/2) < j) <= 0.025``),
so the VM's drift between rounds cancels. The KV content is zeros (it does not change the work).

    .venv/bin/python docs/bench/2026-12-04/shape/forward.py
"""

import math
import time

import torch

from echo_core.tree import make_tree
from echo_server.bench.intervals import cpu_name, rotated
from echo_server.engine.verify import verify_pass
from echo_server.kv import KVPool
from echo_server.model import load_model_only

SHAPES = {
    "decode [1 x 32]": [1] * 32,
    "ECHO's floor, 13 rows [2 x 13, 1 x 19]": [2] * 13 + [1] * 19,
    "ragged, 13 rows [3 x 6, 2 x 1, 1 x 25]": [3] * 6 + [2] + [1] * 25,
    "static K=32, 27 rows [2 x 27, 1 x 5]": [2] * 27 + [1] * 5,
    "32 rows [2 x 32]": [2] * 32,
    "ragged, 32 rows [3 x 16, 1 x 16]": [3] * 16 + [1] * 16,
}
ROUNDS = 21
torch.set_num_threads(1)
model = load_model_only(None, dtype=torch.float32)
gen = torch.Generator().manual_seed(1)
contexts = torch.randint(150, 450, (32,), generator=gen).tolist()
pool = KVPool(model.config, sum(contexts) + 200, max_requests=32, dtype=model.dtype)
handles = [pool.add_request() for _ in contexts]
for h, c in zip(handles, contexts, strict=True):
    pool.append([h], pool.allocate(c), [c])
roots = torch.full((32,), 2, dtype=torch.int64)
trees = {
    name: make_tree([[(3 + i, i - 1, -0.1) for i in range(r - 1)] for r in rows])
    for name, rows in SHAPES.items()
}


def verify(name: str) -> float:
    start = time.perf_counter()
    out = verify_pass(model, pool, handles, roots, trees[name])
    seconds = time.perf_counter() - start
    pool.free(out.slots)
    return seconds


for name in SHAPES:  # warm-up
    verify(name)
t: dict[str, list[float]] = {name: [] for name in SHAPES}
for r in range(ROUNDS):
    for name in rotated(list(SHAPES), r):
        t[name].append(verify(name))


def rank_bound(n: int) -> int:
    """Largest j with P(Bin(n, 1/2) < j) <= 0.025 (1-based order statistic)."""
    j, tail = 0, 0.0
    while tail + math.comb(n, j) / 2**n <= 0.025:
        tail += math.comb(n, j) / 2**n
        j += 1
    return j


lo = rank_bound(ROUNDS)
med = {name: sorted(x)[ROUNDS // 2] * 1e3 for name, x in t.items()}
decode = t["decode [1 x 32]"]
print(f"cpu {cpu_name()}, 1 torch thread, batch 32, contexts 150-450, {ROUNDS} rounds")
print("| rows per request | verify pass ms (median) | ms per draft row beyond decode [95% CI] |")
print("|---|---:|---|")
for name, rows in SHAPES.items():
    extra = sum(rows) - len(rows)
    per = "-"
    if extra:
        d = sorted((a - b) * 1e3 / extra for a, b in zip(t[name], decode, strict=True))
        per = f"{d[ROUNDS // 2]:.2f} [{d[lo - 1]:.2f}, {d[ROUNDS - lo]:.2f}]"
    print(f"| {name} | {med[name]:.1f} | {per} |")
