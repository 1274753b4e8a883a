"""ECHO + the EAGLE draft head vs plain decoding at batch 1, side by side in one process.

For every prompt of HumanEval and MT-Bench (first ``--prompts`` of each) the same engine code runs
plain greedy decoding and then speculative decoding (policy ``--policy`` with the shipped head
and its calibrated GatePolicy), interleaved prompt by prompt so that load changes on a shared
machine hit both alike. Prints per set: tokens/s of each, the speedup, mean accepted length
(tokens per verify pass, 1.0 = plain), draft yield (accepted / verified draft tokens) and
whether the greedy outputs are identical token for token.

    .venv/bin/python packages/echo-server/scripts/bench_drafter.py --prompts 10 --ngram

The defaults (budget 6, depth 4, top-k 2, width 3, min depth gain 0.3) were the fastest of the
shapes tried on this CPU with the shipped head (a quick 3-prompt sweep); see assets/DATA_CARD.md.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from echo_core.sampling import SamplingParams
from echo_gating.policy import GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.policies import make_policy
from echo_server.assets import DEFAULT_GATE, DEFAULT_HEAD
from echo_server.drafting import NgramDrafter
from echo_server.drafting.base import Drafter
from echo_server.drafting.eagle_checkpoint import load_head
from echo_server.drafting.eagle_drafter import EagleDrafter
from echo_server.engine import Engine, EngineConfig, GenerationRequest
from echo_server.model import LoadedModel, load_model
from echo_server.prompts import Prompt, humaneval, mtbench


@dataclass
class Tally:
    seconds: float = 0.0
    tokens: int = 0
    accepted: int = 0
    verified: int = 0
    steps: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def policy_config(args: argparse.Namespace) -> PolicyConfig:
    return PolicyConfig(
        base_depth=min(args.base_depth, args.depth),
        topk=args.topk,
        num_draft_tokens=args.budget + 1,
        max_depth=args.depth,
        max_width=args.width,
        min_depth_gain=args.min_depth_gain,
    )


def run_one(
    loaded: LoadedModel,
    prompt: Prompt,
    policy_name: str,
    drafter: Drafter,
    args: argparse.Namespace,
    gate: GatePolicy | None,
    tally: Tally,
) -> None:
    policy = make_policy(policy_name, policy_config(args), gate if policy_name == "echo" else None)
    budget = 0 if policy_name == "plain" else args.budget
    engine = Engine(
        loaded.model,
        loaded.tokenizer,
        policy,
        drafter,
        EngineConfig(budget=budget, max_batch=1, kv_slots=2048),
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    engine.submit(GenerationRequest("b", prompt=prompt.text, chat=prompt.chat, params=params))
    start = time.perf_counter()
    for _ in engine.run():
        pass
    tally.seconds += time.perf_counter() - start
    state = engine.pop_finished("b")
    tally.tokens += len(state.output_ids)
    tally.accepted += state.accepted
    tally.verified += state.verified
    tally.steps += state.steps
    tally.outputs.append(state.output_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=10, help="prompts per set")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--head", type=Path, default=DEFAULT_HEAD)
    parser.add_argument("--gate", type=Path, default=DEFAULT_GATE)
    parser.add_argument("--policy", default="echo", help="echo, eagle2, global_topk, ...")
    parser.add_argument("--budget", type=int, default=6, help="draft tokens verified per step")
    parser.add_argument("--depth", type=int, default=4, help="max draft depth")
    parser.add_argument("--base-depth", type=int, default=3)
    parser.add_argument("--topk", type=int, default=2, help="frontier nodes per depth")
    parser.add_argument("--width", type=int, default=3, help="children per expanded node")
    parser.add_argument(
        "--min-depth-gain", type=float, default=0.3, help="ECHO drafts deeper only for this gain"
    )
    parser.add_argument(
        "--ngram", action="store_true", help="also run ECHO with the n-gram drafter"
    )
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    loaded = load_model()
    weights = loaded.model.weights
    head = load_head(args.head, weights.embed, weights.lm_head)
    gate = GatePolicy.load(args.gate) if args.gate.is_file() else None
    sets = {"HumanEval": humaneval(args.prompts), "MT-Bench": mtbench(args.prompts)}
    run_one(loaded, sets["HumanEval"][0], "plain", NgramDrafter(), args, None, Tally())  # warm-up
    systems = ["plain", "eagle"] + (["ngram"] if args.ngram else [])
    print(
        f"batch 1, greedy, max {args.max_tokens} tokens, policy {args.policy}, budget "
        f"{args.budget}, depth {args.depth}, top-k {args.topk}, width {args.width}, "
        f"min depth gain {args.min_depth_gain}, gate "
        f"{gate.version if gate else 'none'}, torch threads {torch.get_num_threads()}"
    )
    for name, prompts in sets.items():
        tallies = {s: Tally() for s in systems}
        for p in prompts:
            run_one(loaded, p, "plain", NgramDrafter(), args, None, tallies["plain"])
            run_one(loaded, p, args.policy, EagleDrafter(head), args, gate, tallies["eagle"])
            if args.ngram:
                run_one(loaded, p, args.policy, NgramDrafter(), args, gate, tallies["ngram"])
        base = tallies["plain"]
        print(f"\n{name} ({len(prompts)} prompts, {base.tokens} tokens)")
        print(f"  {'plain':<14} {base.tok_s:7.2f} tok/s")
        for s in systems[1:]:
            t = tallies[s]
            same = sum(a == b for a, b in zip(base.outputs, t.outputs, strict=True))
            mal = (t.accepted + t.steps) / max(t.steps, 1)
            dy = t.accepted / max(t.verified, 1)
            label = f"{args.policy}+{s}"
            print(
                f"  {label:<14} {t.tok_s:7.2f} tok/s  speedup {base.seconds / t.seconds:5.2f}x  "
                f"mean accepted length {mal:5.2f}  draft yield {dy:5.3f}  "
                f"identical {same}/{len(prompts)}"
            )


if __name__ == "__main__":
    main()
