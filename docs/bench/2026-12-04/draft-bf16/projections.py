"""The EAGLE head's seven projection shapes and its draft-vocabulary logits (576 x 8192) through
``echo_server.model.linear.Linear`` (oneDNN-packed), float32 against bfloat16, one thread: warm
(50 calls, median of 7) and with cold caches (a 256 MB sweep before each pass, median of 15).

    .venv/bin/python docs/bench/2026-12-04/draft-bf16/projections.py
"""

from __future__ import annotations

import statistics
import time

import torch

from echo_server.model.linear import Linear, packing_available

SHAPES = [(576, 1152), (576, 1728), (576, 576), (192, 576), (1536, 576), (576, 1536), (8192, 576)]


def _layers(dtype: torch.dtype, rows: int) -> tuple[list[Linear], list[torch.Tensor]]:
    lins = [Linear(torch.randn(o, i).to(dtype), None, allow_bf16=True) for o, i in SHAPES]
    return lins, [torch.randn(rows, i).to(dtype) for _, i in SHAPES]


def warm(dtype: torch.dtype, rows: int) -> float:
    lins, xs = _layers(dtype, rows)
    for _ in range(20):
        for lin, x in zip(lins, xs, strict=True):
            lin(x)
    times = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(50):
            for lin, x in zip(lins, xs, strict=True):
                lin(x)
        times.append((time.perf_counter() - t) / 50 * 1e3)
    return statistics.median(times)


def cold(dtype: torch.dtype, rows: int, sweep: torch.Tensor) -> float:
    lins, xs = _layers(dtype, rows)
    times = []
    for _ in range(15):
        sweep.add_(1.0)
        t = time.perf_counter()
        for lin, x in zip(lins, xs, strict=True):
            lin(x)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    for dtype in (torch.float32, torch.bfloat16):
        print(dtype, "packs:", packing_available(torch.zeros(1, 1, dtype=dtype), allow_bf16=True))
    print(
        "avx512_bf16:", torch.cpu._is_avx512_bf16_supported(),
        "amx:", torch.cpu._is_amx_tile_supported(),
    )  # fmt: skip
    for rows in (1, 2, 4, 8):
        print(f"warm, {rows} rows: float32 {warm(torch.float32, rows):.2f} ms, "
              f"bfloat16 {warm(torch.bfloat16, rows):.2f} ms")  # fmt: skip
    sweep = torch.randn(64 * 1024 * 1024)
    for rows in (1, 2, 4, 8):
        print(f"cold, {rows} rows: float32 {cold(torch.float32, rows, sweep):.2f} ms, "
              f"bfloat16 {cold(torch.bfloat16, rows, sweep):.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
