"""``echo-sd generate``: answer one prompt, streaming text to stdout and stats to stderr."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from echo_core.sampling import SamplingParams
from echo_server.cli.options import POLICY_CHOICES, add_engine_options, build_engine, load
from echo_server.engine import GenerationRequest


def add_parser(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate an answer for one prompt")
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--policy", choices=POLICY_CHOICES, default="echo")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="send the prompt without the chat template")
    add_engine_options(p)


def run(args: argparse.Namespace) -> int:
    params = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        seed=args.seed,
        stop=tuple(args.stop),
    )
    request = GenerationRequest("cli", prompt=args.prompt, chat=not args.raw, params=params)
    loaded = load(args)
    engine = build_engine(loaded, args.policy, args)
    engine.submit(request)
    start = time.perf_counter()
    for event in engine.run():
        sys.stdout.write(event.text)
        sys.stdout.flush()
    elapsed = time.perf_counter() - start
    state = engine.pop_finished("cli")
    sys.stdout.write("\n")
    n = len(state.output_ids)
    finish = state.finish_reason.value if state.finish_reason else "?"
    print(
        f"[{args.policy}] tokens={n} tokens_per_s={n / elapsed:.2f} "
        f"mean_accepted_length={state.mean_accepted_length:.2f} "
        f"draft_yield={state.draft_yield:.2f} finish={finish}",
        file=sys.stderr,
    )
    return 0
