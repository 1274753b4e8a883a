"""Cost of one target forward over T rows: the engine's projections vs ``F.linear``.

The engine's (``packed`` column) are oneDNN-packed from two rows on; one row takes whichever
path ``echo_server.model.linear.single_row_path`` chose at load (``ECHO_LINEAR_SINGLE_ROW``).

One request with a 64-token cached prefix verifies a chain of T - 1 draft rows (T rows in all),
the shape of a batch-1 verify pass. Both runners share the same weights in one process and are
timed alternately; the table gives median ms per pass and each T's cost relative to T = 1.

    .venv/bin/python packages/echo-server/scripts/bench_verify_rows.py --threads 1
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from echo_core.tree import make_tree
from echo_server.kv import KVPool
from echo_server.model import load_model_only
from echo_server.model.attention import tree_row_mask
from echo_server.model.llama import LlamaModel

PREFIX = 64


def _runner(packed: bool, base: LlamaModel) -> LlamaModel:
    os.environ["ECHO_PACKED_LINEAR"] = "1" if packed else "0"
    try:
        return LlamaModel(base.config, base.weights, base.attention)
    finally:
        os.environ.pop("ECHO_PACKED_LINEAR", None)


def _timer(model: LlamaModel, rows: int) -> float:
    """Seconds of one verify-shaped pass over ``rows`` rows (fresh pool each call)."""
    pool = KVPool(model.config, PREFIX + rows + 8, max_requests=1, dtype=model.dtype)
    handle = pool.add_request()
    slots = pool.allocate(PREFIX)
    ids = torch.randint(0, 1000, (PREFIX,), generator=torch.Generator().manual_seed(0))
    batch = pool.attention_batch([handle], [PREFIX], slots)
    model.forward(ids, torch.arange(PREFIX), batch, pool.storage)
    pool.append([handle], slots, [PREFIX])
    chain = make_tree([[(1, i - 1, -0.1) for i in range(rows - 1)]])
    write = pool.allocate(rows)
    batch = pool.attention_batch([handle], [rows], write, tree_row_mask(chain))
    tokens = torch.full((rows,), 2, dtype=torch.int64)
    start = time.perf_counter()
    model.logits(model.forward(tokens, PREFIX + torch.arange(rows), batch, pool.storage).hidden)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["ECHO_PACKED_LINEAR"] = "0"  # the base keeps its plain weights for both runners
    try:
        base = load_model_only(None, dtype=torch.float32)
    finally:
        os.environ.pop("ECHO_PACKED_LINEAR", None)
    runners = {"F.linear": _runner(False, base), "packed": _runner(True, base)}
    if runners["packed"].lm_head.packed is None:
        raise SystemExit("oneDNN packing is not available on this machine")
    print(f"| rows | {' | '.join(f'{n} ms' for n in runners)} | packed speedup |")
    print("|---:|---:|---:|---:|")
    first: dict[str, float] = {}
    for rows in args.rows:
        med: dict[str, float] = {}
        for model in runners.values():
            _timer(model, rows)  # warm-up
        samples: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.repeats):
            for name, model in runners.items():
                samples[name].append(_timer(model, rows))
        for name, values in samples.items():
            med[name] = sorted(values)[len(values) // 2] * 1000
            first.setdefault(name, med[name])
        cells = " | ".join(f"{med[n]:.1f} ({med[n] / first[n]:.2f}x T=1)" for n in runners)
        print(f"| {rows} | {cells} | {med['F.linear'] / med['packed']:.2f}x |")


if __name__ == "__main__":
    main()
