"""``echo-sd demo``: the main job on the embedded default.

Loads SmolLM2-135M-Instruct (CPU) and answers real prompts (HumanEval and MT-Bench first turns)
with plain greedy decoding and with ECHO, side by side in one process; prints whether the outputs
are identical token for token and the measured speedup.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from tqdm import tqdm

from echo_core.sampling import SamplingParams
from echo_server.cli.options import POLICY_CHOICES, add_engine_options, build_engine, load
from echo_server.engine import GenerationRequest
from echo_server.model.loader import LoadedModel
from echo_server.prompts import Prompt, humaneval, mtbench


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="plain decoding vs ECHO on real prompts, side by side")
    p.add_argument("--prompts-per-set", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--policy", choices=POLICY_CHOICES, default="echo")
    add_engine_options(p)
    p.set_defaults(max_batch=1)


def _run_policy(
    loaded: LoadedModel, policy: str, prompts: list[Prompt], args: argparse.Namespace
) -> tuple[list[list[int]], float, float]:
    """Outputs, wall seconds and mean accepted length of one policy over ``prompts``."""
    engine = build_engine(loaded, policy, args)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    for p in prompts:
        engine.submit(GenerationRequest(p.prompt_id, prompt=p.text, chat=p.chat, params=params))
    start = time.perf_counter()
    with tqdm(total=len(prompts), desc=f"{policy:>6}", unit="prompt", leave=False) as bar:
        for event in engine.run():
            if event.finish_reason is not None:
                bar.update(1)
    elapsed = time.perf_counter() - start
    outputs = [engine.pop_finished(p.prompt_id).output_ids for p in prompts]
    return outputs, elapsed, engine.metrics.acceptance.mean_accepted_length


def run(args: argparse.Namespace) -> int:
    n = args.prompts_per_set
    prompts = humaneval(n) + mtbench(n)
    print(f"loading the embedded model ({args.model or 'SmolLM2-135M-Instruct, GGUF'}) ...")
    loaded = load(args)
    _run_policy(loaded, "plain", prompts[:1], args)  # warm-up: first-call overheads
    base, base_s, _ = _run_policy(loaded, "plain", prompts, args)
    spec, spec_s, mal = _run_policy(loaded, args.policy, prompts, args)
    same = sum(a == b for a, b in zip(base, spec, strict=True))
    tokens = sum(len(o) for o in base)
    print(f"\n{len(prompts)} prompts (HumanEval + MT-Bench), greedy, max {args.max_tokens} tokens")
    print(f"plain        {tokens / base_s:7.2f} tok/s")
    spec_tps = sum(len(o) for o in spec) / spec_s
    print(f"{args.policy:<12} {spec_tps:7.2f} tok/s   mean accepted length {mal:.2f}")
    print(f"speedup      {base_s / spec_s:7.2f}x")
    print(f"identical    {same}/{len(prompts)} outputs token for token")
    print("\nfirst answer:\n" + loaded.tokenizer.decode(spec[0]))
    return 0 if same == len(prompts) else 1
