"""Session 19: the engine's verify pass at batch B with N draft rows, one per request, N = 0..B.

Is a draft row's cost a constant slope, or does the first row pay for a block of rows (GEMM
tiling) that the next ones then fill for free? The engine's ``verify_pass`` (embedded model,
default attention and linear paths, logits over every row) for B requests with cached contexts
of 150-450 tokens (one fixed draw; the KV content is zeros, which does not change the work), the
first N requests each verifying one draft row. 21 rounds, the N's order rotated; per N the
median over rounds of (pass - the same round's N = 0 pass) in ms, with the order-statistics 95%
interval of that median (as in forward.py).

    .venv/bin/python docs/bench/2026-12-04/shape/rows.py --batch 16
"""

import argparse
import math
import time

import torch

from echo_core.tree import make_tree
from echo_server.bench.intervals import cpu_name, rotated
from echo_server.engine.verify import verify_pass
from echo_server.kv import KVPool
from echo_server.model import load_model_only

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--batch", type=int, default=16)
p.add_argument("--rows", type=int, nargs="+", default=None, help="N values (default 0..B)")
p.add_argument("--rounds", type=int, default=21)
a = p.parse_args()
B, ROUNDS = a.batch, a.rounds
NS = sorted(set([0] + (a.rows if a.rows is not None else list(range(B + 1)))))
torch.set_num_threads(1)
model = load_model_only(None, dtype=torch.float32)
gen = torch.Generator().manual_seed(1)
contexts = torch.randint(150, 450, (B,), generator=gen).tolist()
pool = KVPool(model.config, sum(contexts) + 2 * B + 8, max_requests=B, dtype=model.dtype)
handles = [pool.add_request() for _ in contexts]
for h, c in zip(handles, contexts, strict=True):
    pool.append([h], pool.allocate(c), [c])
roots = torch.full((B,), 2, dtype=torch.int64)
trees = {n: make_tree([[(3, -1, -0.1)] if b < n else [] for b in range(B)]) for n in NS}


def verify(n: int) -> float:
    start = time.perf_counter()
    out = verify_pass(model, pool, handles, roots, trees[n])
    seconds = time.perf_counter() - start
    pool.free(out.slots)
    return seconds


def rank_bound(n: int) -> int:
    """Largest j with P(Bin(n, 1/2) < j) <= 0.025 (1-based order statistic)."""
    j, tail = 0, 0.0
    while tail + math.comb(n, j) / 2**n <= 0.025:
        tail += math.comb(n, j) / 2**n
        j += 1
    return j


for n in NS:  # warm-up
    verify(n)
t: dict[int, list[float]] = {n: [] for n in NS}
for r in range(ROUNDS):
    for n in rotated([str(n) for n in NS], r):
        t[int(n)].append(verify(int(n)))
lo = rank_bound(ROUNDS)
print(f"cpu {cpu_name()}, 1 torch thread, batch {B}, contexts 150-450, {ROUNDS} rounds")
print(f"N = 0: {sorted(t[0])[ROUNDS // 2] * 1e3:.1f} ms (median)")
print("| draft rows N | pass - decode pass, ms [95% CI] | per row ms |")
print("|---:|---|---:|")
for n in NS[1:]:
    d = sorted((x - y) * 1e3 for x, y in zip(t[n], t[0], strict=True))
    print(f"| {n} | {d[ROUNDS // 2]:.1f} [{d[lo - 1]:.1f}, {d[ROUNDS - lo]:.1f}] | "
          f"{d[ROUNDS // 2] / n:.2f} |")  # fmt: skip
