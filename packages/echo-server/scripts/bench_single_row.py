"""Plain decoding with the engine's single-row dispatch vs packed-only projections, interleaved.

Two copies of the embedded model are loaded, one with ``ECHO_LINEAR_SINGLE_ROW=packed`` (every
projection oneDNN-packed, as before 2026-12-01) and one with the default ``auto`` (1-row calls on
``F.linear``'s GEMV where it is faster: echo_server/model/linear.py). Plain greedy decoding runs
the six demo prompts on both, alternating the order prompt by prompt, for 3 rounds; prints the
median per-prompt time ratio with its 5-95% range and whether the outputs are identical.

    .venv/bin/python packages/echo-server/scripts/bench_single_row.py
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from echo_core.sampling import SamplingParams
from echo_server.bench.intervals import cpu_name
from echo_server.cli import build_parser
from echo_server.cli.options import build_engine, load
from echo_server.engine import Engine, GenerationRequest
from echo_server.prompts import Prompt, humaneval, mtbench

MODES = ("packed", "auto")


def _generate(engine: Engine, prompt: Prompt, max_tokens: int) -> tuple[list[int], float]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    engine.submit(GenerationRequest(prompt.prompt_id, prompt=prompt.text, chat=prompt.chat,
                                    params=params))  # fmt: skip
    start = time.perf_counter()
    for _ in engine.run():
        pass
    elapsed = time.perf_counter() - start
    return list(engine.pop_finished(prompt.prompt_id).output_ids), elapsed


def main(rounds: int = 3, max_tokens: int = 48) -> None:
    torch.set_num_threads(1)
    args = build_parser().parse_args(["demo"])
    engines = {}
    for mode in MODES:
        os.environ["ECHO_LINEAR_SINGLE_ROW"] = mode
        engines[mode] = build_engine(load(args), "plain", args)
    os.environ.pop("ECHO_LINEAR_SINGLE_ROW")
    prompts = humaneval(3) + mtbench(3)
    for engine in engines.values():
        _generate(engine, prompts[0], 8)  # warm-up
    ratios: list[float] = []
    outputs: dict[str, list[list[int]]] = {m: [] for m in MODES}
    for r in range(rounds):
        for i, prompt in enumerate(prompts):
            seconds = {}
            for mode in MODES if (r + i) % 2 == 0 else reversed(MODES):
                out, seconds[mode] = _generate(engines[mode], prompt, max_tokens)
                if r == 0:
                    outputs[mode].append(out)
            ratios.append(seconds["packed"] / seconds["auto"])
    same = sum(a == b for a, b in zip(outputs["packed"], outputs["auto"], strict=True))
    cuts = statistics.quantiles(ratios, n=20)
    print(f"cpu {cpu_name()}, 1 torch thread; plain decoding, {len(ratios)} paired runs")
    print(
        f"time packed-only / auto: median {statistics.median(ratios):.3f} "
        f"(5-95%: {cuts[0]:.3f}-{cuts[-1]:.3f}); identical outputs {same}/{len(prompts)}"
    )


if __name__ == "__main__":
    main()
