"""One EAGLE-head drafting call with warm and with cold caches: how much of the head's cost in a
decode step is reading its weights back from memory.

The shipped head (the machine's draft dtype) runs one call over ``rows`` rows (fc + aux, q/k/v
with RoPE, attention over a 200-row context, o-proj + MLP, draft logits + log-softmax), timed
alone. ``warm``: the call repeated back to back. ``cold``: before each call a 512 MiB buffer is
summed, evicting every cache level as a target forward does (SmolLM2-135M streams about 540 MB of
float32 weights per forward). Medians over ``--repeats`` calls, warm and cold interleaved.

    .venv/bin/python packages/echo-server/scripts/bench_head_call.py --rows 1 3 6
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from echo_server.bench.intervals import cpu_name
from echo_server.cli import build_parser
from echo_server.cli.options import load
from echo_server.drafting.eagle_drafter import EagleDrafter, eagle_drafter_for

EVICT_BYTES = 512 << 20
CONTEXT = 200  # head cache rows the call attends to


def head_call(drafter: EagleDrafter, rows: int) -> Callable[[], None]:
    """One drafting call of the head over ``rows`` new rows (module docstring), inputs fixed."""
    head, cfg = drafter.head, drafter.head.config
    h, dtype = cfg.hidden_size, drafter.dtype
    feats = torch.randn(rows, h * (1 + len(cfg.aux_layers))).to(dtype)
    aux = feats[:, h:] if cfg.aux_layers else None
    tokens = torch.randint(0, cfg.target_vocab_size, (rows,))
    positions = torch.arange(CONTEXT, CONTEXT + rows)
    k_ctx = torch.randn(CONTEXT + rows, cfg.num_kv_heads, cfg.head_dim).to(dtype)
    v_ctx = torch.randn_like(k_ctx)
    mask = torch.ones(rows, CONTEXT + rows, dtype=torch.bool)

    def call() -> None:
        with torch.inference_mode():
            x = head.fuse(feats[:, :h], tokens, aux)
            q, _, _ = head.project(x, positions)
            out = head.finish(x, drafter._attend(q, k_ctx, v_ctx, mask))  # the drafter's own
            torch.log_softmax(head.logits(out).float(), dim=-1)

    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 3, 6])
    p.add_argument("--repeats", type=int, default=200)
    a = p.parse_args()
    torch.set_num_threads(1)
    loaded = load(build_parser().parse_args(["bench", "--threads", "1"]))
    drafter = eagle_drafter_for(loaded.model)
    evict = torch.ones(EVICT_BYTES // 4)
    name, dtype = cpu_name(), drafter.dtype
    print(f"# {name}, one thread; head dtype {dtype}; ms per call, median of {a.repeats}")
    print("rows | warm | cold | cold - warm")
    for rows in a.rows:
        call = head_call(drafter, rows)
        for _ in range(20):
            call()
        warm, cold = [], []
        for _ in range(a.repeats):
            start = time.perf_counter()
            call()
            warm.append(time.perf_counter() - start)
            float(evict.sum())
            start = time.perf_counter()
            call()
            cold.append(time.perf_counter() - start)
        w, c = 1000 * statistics.median(warm), 1000 * statistics.median(cold)
        print(f"{rows} | {w:.3f} | {c:.3f} | {c - w:.3f}")


if __name__ == "__main__":
    main()
