"""``echo-sd demo``: the main job on the embedded default.

Loads SmolLM2-135M-Instruct (CPU) and answers real prompts (HumanEval and MT-Bench first turns)
with plain greedy decoding and with ECHO, in one process; prints whether the outputs are
identical token for token and the measured speedup. The two arms are interleaved per prompt
(the order alternates prompt by prompt and round by round) for ``--rounds`` rounds, and the
speedup is the median round's ratio with a paired 95% bootstrap interval over prompts
(:mod:`echo_lab.bench.intervals`), so the machine's drift lands on both arms.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from tqdm import tqdm

from echo_core.sampling import SamplingParams
from echo_lab.bench.intervals import cpu_name, paired_ratio, rotated
from echo_server.cli.options import POLICY_CHOICES, add_engine_options, build_engine, load
from echo_server.engine import Engine, GenerationRequest
from echo_server.prompts import Prompt, humaneval, mtbench


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="plain decoding vs ECHO on real prompts, side by side")
    p.add_argument("--prompts-per-set", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    p.add_argument("--policy", choices=POLICY_CHOICES, default="echo")
    add_engine_options(p)
    p.set_defaults(max_batch=1)


def _generate(engine: Engine, prompt: Prompt, max_tokens: int) -> tuple[list[int], float]:
    """Greedy output of ``prompt`` alone on ``engine`` and the seconds it took."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    rid = prompt.prompt_id  # popped when finished, so every run may reuse it
    start = time.perf_counter()
    engine.submit(GenerationRequest(rid, prompt=prompt.text, chat=prompt.chat, params=params))
    for _ in engine.run():
        pass
    elapsed = time.perf_counter() - start
    return list(engine.pop_finished(rid).output_ids), elapsed


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise SystemExit("echo-sd demo: --rounds must be >= 1")
    n = args.prompts_per_set
    prompts = humaneval(n) + mtbench(n)
    print(f"loading the embedded model ({args.model or 'SmolLM2-135M-Instruct, GGUF'}) ...")
    loaded = load(args)
    arms = ["plain", args.policy]
    engines = {arm: build_engine(loaded, arm, args) for arm in arms}
    for arm in arms:  # warm-up: first-call overheads
        _generate(engines[arm], prompts[0], 8)
    engines[args.policy].metrics.reset()
    seconds = {arm: [[0.0] * len(prompts) for _ in range(args.rounds)] for arm in arms}
    outputs: dict[str, list[list[int]]] = {arm: [[] for _ in prompts] for arm in arms}
    total = args.rounds * len(prompts) * len(arms)
    with tqdm(total=total, desc="interleaved", unit="run", leave=False) as bar:
        for r in range(args.rounds):
            for i, prompt in enumerate(prompts):
                for arm in rotated(arms, r + i):
                    out, sec = _generate(engines[arm], prompt, args.max_tokens)
                    seconds[arm][r][i] = sec
                    if r == 0:
                        outputs[arm][i] = out
                    elif out != outputs[arm][i]:
                        raise RuntimeError(f"{arm}: greedy output changed between rounds")
                    bar.update(1)
    base, spec = outputs["plain"], outputs[args.policy]
    same = sum(a == b for a, b in zip(base, spec, strict=True))
    speed = paired_ratio(seconds["plain"], seconds[args.policy])
    mal = engines[args.policy].metrics.acceptance.mean_accepted_length
    threads = torch.get_num_threads()

    def tps(arm: str) -> float:
        tokens = sum(len(o) for o in outputs[arm]) * int(args.rounds)
        return tokens / sum(sum(row) for row in seconds[arm])

    print(
        f"\n{len(prompts)} prompts (HumanEval + MT-Bench), greedy, max {args.max_tokens} tokens, "
        f"{args.rounds} interleaved rounds"
    )
    print(f"cpu          {cpu_name()}, {threads} torch thread(s)")
    print(f"plain        {tps('plain'):7.2f} tok/s")
    print(f"{args.policy:<12} {tps(args.policy):7.2f} tok/s   mean accepted length {mal:.2f}")
    print(f"speedup      {speed.describe()}")
    print(f"identical    {same}/{len(prompts)} outputs token for token")
    print("\nfirst answer:\n" + loaded.tokenizer.decode(spec[0]))
    return 0 if same == len(prompts) else 1
