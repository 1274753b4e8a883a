"""Engine steps in inference mode (the shipped ``Engine.step``) against ``torch.no_grad`` (before
session 24), for plain decoding and ECHO, interleaved prompt by prompt in rotated order.

Four engines share one loaded model: (plain, ECHO) x (inference mode, no_grad). The no_grad arm
calls the undecorated step (``Engine.step.__wrapped__``) inside ``torch.no_grad()``, which is how
every step ran before. Prints per round the tokens/s of each arm (prefill included, greedy, one
request at a time), then per policy the median ratio inference-mode / no_grad over the rounds and
ECHO / plain in each mode.

    .venv/bin/python packages/echo-server/scripts/bench_inference_mode.py --workload humaneval \\
        --num-prompts 6 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from echo_core.sampling import SamplingParams
from echo_server.bench.workloads import load_workloads
from echo_server.cli import build_parser
from echo_server.cli.bench import _factory
from echo_server.cli.options import load
from echo_server.engine import Engine, GenerationRequest
from echo_server.prompts import Prompt

MODES = ("inference", "no_grad")
POLICIES = ("plain", "echo")


def generate(
    engine: Engine, mode: str, prompt: Prompt, request_id: str, max_tokens: int
) -> tuple[float, int]:
    """Seconds and tokens of one greedy request run to completion alone."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    engine.submit(GenerationRequest(request_id, prompt=prompt.text, params=params))
    start = time.perf_counter()
    while engine.has_work():
        if mode == "inference":
            engine.step()
        else:
            with torch.no_grad():
                Engine.step.__wrapped__(engine)  # type: ignore[attr-defined]
    seconds = time.perf_counter() - start
    return seconds, len(engine.pop_finished(request_id).output_ids)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="humaneval")
    p.add_argument("--num-prompts", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    a = p.parse_args()
    torch.set_num_threads(1)
    argv = ["bench", "--threads", "1", "--max-tokens", str(a.max_tokens), "--workloads", a.workload]
    args = build_parser().parse_args(argv)
    workloads = load_workloads(args.workloads, a.num_prompts, args.prompts)
    make = _factory(load(args), args, workloads)
    arms = [(policy, mode) for policy in POLICIES for mode in MODES]
    engines = {arm: make(arm[0], 1) for arm in arms}
    rates: dict[tuple[str, str], list[float]] = {arm: [] for arm in arms}
    for r in range(a.rounds):
        totals = {arm: [0.0, 0] for arm in arms}
        for i, prompt in enumerate(workloads[0].prompts):
            shift = (r + i) % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                rid = f"{arm[0]}-{arm[1]}-{r}-{i}"
                seconds, tokens = generate(engines[arm], arm[1], prompt, rid, a.max_tokens)
                totals[arm][0] += seconds
                totals[arm][1] += tokens
        for arm in arms:
            rates[arm].append(totals[arm][1] / totals[arm][0])
        print(
            f"round {r}: "
            + ", ".join(f"{pol}-{m} {rates[(pol, m)][-1]:.2f} tok/s" for pol, m in arms)
        )
    for policy in POLICIES:
        ratios = [
            x / y
            for x, y in zip(rates[(policy, "inference")], rates[(policy, "no_grad")], strict=True)
        ]
        rounds = ", ".join(f"{x:.3f}" for x in ratios)
        median = statistics.median(ratios)
        print(f"{policy}: inference mode / no_grad = {median:.3f} (rounds {rounds})")
    for mode in MODES:
        ratios = [x / y for x, y in zip(rates[("echo", mode)], rates[("plain", mode)], strict=True)]
        rounds = ", ".join(f"{x:.3f}" for x in ratios)
        print(f"echo / plain, {mode}: {statistics.median(ratios):.3f} (rounds {rounds})")


if __name__ == "__main__":
    main()
