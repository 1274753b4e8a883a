"""What few rows cost on this CPU: every projection swept per row count, and whole verify passes.

Two tables, one torch thread, medians over interleaved rounds (the order rotated each round):

1. ``projections``: the model's projections of one name over all its layers (as a forward
   streams them) for 1-8 rows, packed and unpadded (model/linear.py ``sweep``), ms per sweep;
   the engine's chosen padding (``row_paths``) beside them.
2. ``verify``: a verify pass (forward + logits) of ``--batch`` requests (contexts 250 + 37 b)
   with 0..``--extra`` draft rows spread one per request, relative to the pass without drafts,
   with the engine's padding as loaded.

    .venv/bin/python packages/echo-server/scripts/bench_row_staircase.py --batch 1 4 8
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable

import torch

from echo_core.tree import make_tree
from echo_server.bench.intervals import cpu_name
from echo_server.kv import KVPool
from echo_server.model import load_model_only
from echo_server.model.attention import tree_row_mask
from echo_server.model.linear import MAX_PADDED_ROWS, Linear, rotating_medians, sweep
from echo_server.model.llama import LlamaModel

NAMES = ("qkv", "o_proj", "gate_up", "down")


def _ms(calls: dict[str, Callable[[], None]], rounds: int) -> dict[str, float]:
    """Median ms of each call over ``rounds`` rotated rounds (linear.py ``rotating_medians``)."""
    return {name: 1000 * s for name, s in rotating_medians(calls, rounds).items()}


def projections(model: LlamaModel, rounds: int) -> None:
    groups: dict[str, list[Linear]] = {n: [getattr(mm, n) for mm in model.linears] for n in NAMES}
    groups["lm_head"] = [model.lm_head]
    sizes = range(1, MAX_PADDED_ROWS + 1)
    calls: dict[str, Callable[[], None]] = {}
    for name, group in groups.items():
        for m in sizes:
            calls[f"{name}:{m}"] = sweep(group, torch.zeros(m, group[0].in_features), packed=True)
    ms = _ms(calls, rounds)
    print("| projection | " + " | ".join(f"{m} rows" for m in sizes) + " | padding |")
    print("|---|" + "---:|" * len(sizes) + "---|")
    for name, group in groups.items():
        cells = " | ".join(f"{ms[f'{name}:{m}']:.2f}" for m in sizes)
        pad = group[0].pad_to
        print(f"| {name} | {cells} | {list(pad) if pad else 'none'} |")
    total = [sum(ms[f"{n}:{m}"] for n in groups) for m in sizes]
    print("| all | " + " | ".join(f"{t:.1f}" for t in total) + " | |")


def verify(model: LlamaModel, batch: int, extra: int, rounds: int) -> None:
    ctx = [250 + 37 * b for b in range(batch)]
    pool = KVPool(model.config, sum(ctx) + (extra + 2) * batch + 8, max_requests=batch)
    handles = [pool.add_request() for _ in range(batch)]
    g = torch.Generator().manual_seed(0)
    for h, c in zip(handles, ctx, strict=True):
        slots = pool.allocate(c)
        ids = torch.randint(0, model.config.vocab_size, (c,), generator=g)
        model.forward(ids, torch.arange(c), pool.attention_batch([h], [c], slots), pool.storage)
        pool.append([h], slots, [c])

    def rows_for(n: int) -> list[int]:
        rows = [1] * batch
        for i in range(n):
            rows[i % batch] += 1
        return rows

    def run(rows: list[int]) -> None:
        tree = make_tree([[(1, -1, -0.1)] * (r - 1) for r in rows])
        write = pool.allocate(sum(rows))
        mask = None if all(r == 1 for r in rows) else tree_row_mask(tree)
        attn = pool.attention_batch(handles, rows, write, mask)
        tokens = torch.full((sum(rows),), 2, dtype=torch.int64)
        pos = torch.cat([c + torch.arange(r) for c, r in zip(ctx, rows, strict=True)])
        model.logits(model.forward(tokens, pos, attn, pool.storage).hidden)
        pool.free(write)

    calls: dict[str, Callable[[], None]] = {}
    for n in range(extra + 1):
        calls[str(n)] = functools.partial(run, rows_for(n))
    ms = _ms(calls, rounds)
    base = ms["0"]
    cells = "  ".join(f"+{n}: {ms[str(n)] / base:.3f}" for n in range(extra + 1))
    print(f"batch {batch} (pass without drafts {base:.1f} ms): {cells}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="*", default=[1, 4, 8])
    p.add_argument("--extra", type=int, default=12, help="most draft rows per verify pass")
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    torch.set_num_threads(1)
    model = load_model_only(None, dtype=torch.float32)
    print(f"cpu {cpu_name()}, 1 torch thread; ms per sweep, medians of {a.rounds} rounds\n")
    projections(model, a.rounds)
    print()
    for b in a.batch:
        verify(model, b, a.extra, a.rounds)


if __name__ == "__main__":
    main()
