"""Session 19: the start-up verify profile's slope, measured in interleaved rounds, against the
marginal cost of draft rows added to a batch of 8 requests (what ECHO's row price stands for).

Arms, each one verify pass (``verify_pass``: the embedded model, logits over every row), timed in
``--rounds`` rounds with the arms' order rotated each round, so the VM's drift lands on all:

- ``1 x T``: the profile's shape (engine/budget.py ``measure_profile``): one request with a
  64-token cached prefix verifying a chain of T - 1 draft rows, T in 8, 16, 32;
- ``8 + N``: 8 requests with cached contexts of 150-450 tokens (one fixed draw; zero KV), the
  first N of them verifying one draft row each, N in 0, 4, 8.

Prints each arm's median ms and, paired within rounds, the per-token slopes the profile prices
rows by (16 - 8 and 32 - 16 tokens of ``1 x T``, per token) against the per-row cost of ``8 + N``
over ``8 + 0``; median and the order-statistics 95% interval of the median.

    .venv/bin/python docs/bench/2026-12-04/profile/profile_rounds.py --rounds 21
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
p.add_argument("--rounds", type=int, default=21)
ROUNDS = p.parse_args().rounds
torch.set_num_threads(1)
model = load_model_only(None, dtype=torch.float32)


def setup(contexts: list[int]) -> tuple[KVPool, list[int]]:
    pool = KVPool(model.config, sum(contexts) + 64, max_requests=len(contexts), dtype=model.dtype)
    handles = [pool.add_request() for _ in contexts]
    for h, c in zip(handles, contexts, strict=True):
        pool.append([h], pool.allocate(c), [c])
    return pool, handles


single = setup([64])
gen = torch.Generator().manual_seed(1)
batch8 = setup(torch.randint(150, 450, (8,), generator=gen).tolist())
ARMS = {}
for t in (8, 16, 32):
    ARMS[f"1 x {t}"] = (single, make_tree([[(3, i - 1, -0.1) for i in range(t - 1)]]))
for n in (0, 4, 8):
    ARMS[f"8 + {n}"] = (batch8, make_tree([[(3, -1, -0.1)] if b < n else [] for b in range(8)]))


def verify(name: str) -> float:
    (pool, handles), tree = ARMS[name]
    roots = torch.full((len(handles),), 2, dtype=torch.int64)
    start = time.perf_counter()
    out = verify_pass(model, pool, handles, roots, tree)
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


for name in ARMS:  # warm-up
    verify(name)
t: dict[str, list[float]] = {name: [] for name in ARMS}
for r in range(ROUNDS):
    for name in rotated(list(ARMS), r):
        t[name].append(verify(name))
lo = rank_bound(ROUNDS)


def paired(a: str, b: str, per: int) -> str:
    d = sorted((x - y) * 1e3 / per for x, y in zip(t[a], t[b], strict=True))
    return f"{d[ROUNDS // 2]:.2f} [{d[lo - 1]:.2f}, {d[ROUNDS - lo]:.2f}]"


print(f"cpu {cpu_name()}, 1 torch thread, {ROUNDS} rounds, arms rotated")
print("| arm | median ms |")
print("|---|---:|")
for name, x in t.items():
    print(f"| {name} | {sorted(x)[ROUNDS // 2] * 1e3:.1f} |")
print("| priced as | ms per row [95% CI] |")
print("|---|---|")
print(f"| profile slope, 8 -> 16 tokens of one request | {paired('1 x 16', '1 x 8', 8)} |")
print(f"| profile slope, 16 -> 32 tokens of one request | {paired('1 x 32', '1 x 16', 16)} |")
print(f"| batch 8, 4 draft rows over none | {paired('8 + 4', '8 + 0', 4)} |")
print(f"| batch 8, 8 draft rows over none | {paired('8 + 8', '8 + 0', 8)} |")
