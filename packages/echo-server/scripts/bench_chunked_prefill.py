"""What one long prompt does to a running batch, with and without chunked prefill, interleaved.

Scenario (one round per arm): ``--short`` MT-Bench requests decode with ECHO (the embedded
default: SmolLM2, EAGLE head + prompt lookup, calibrated gate, elastic floor) for
``--max-tokens`` tokens each, EOS ignored; after ``--arrive-after`` steps a long request arrives
(a summarise-this prompt of about ``--long-tokens`` tokens of Python's own language reference,
16 output tokens). Arms: the whole prompt prefilled in one step, and ``--prefill-chunk`` rows per
step for each ``--prefill-chunk`` (engine/chunking.py). Every round runs each arm once, the
order rotated round by round, over ``--rounds`` rounds; every request runs at once (max batch
``--short`` + 1).

Per arm, medians over rounds of:

- per-token latency of the short requests (bench/metrics.py's definition: an event bringing n
  tokens after a gap g counts n samples of g / n), p50, p99 and the largest single gap;
- TTFT of the long request (submit to first token);
- wall time of the round (every request done), and whether every output equals the first arm's.

    .venv/bin/python packages/echo-server/scripts/bench_chunked_prefill.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from echo_core.sampling import SamplingParams
from echo_server.bench.intervals import cpu_name
from echo_server.bench.metrics import percentile
from echo_server.cli import build_parser
from echo_server.cli.options import build_engine, load
from echo_server.engine import Engine, GenerationRequest
from echo_server.model.loader import LoadedModel
from echo_server.prompts import mtbench


@dataclass(slots=True)
class Round:
    """One arm's round: emission gaps of the short requests and the long request's TTFT."""

    per_token: list[float] = field(default_factory=list)
    max_gap: float = 0.0
    ttft_long: float = float("nan")
    wall: float = 0.0
    outputs: dict[str, list[int]] = field(default_factory=dict)


def long_prompt(loaded: LoadedModel, tokens: int) -> str:
    """About ``tokens`` tokens of the language reference, asked to be summarised."""
    from pydoc_data.topics import topics  # the interpreter's own docs: on every machine

    text = " ".join(topics[k] for k in sorted(topics))
    words = text.split()
    n = tokens * 3 // 4
    while len(loaded.tokenizer.encode(" ".join(words[:n]))) < tokens:
        n += 32
    return "Summarise the following reference text in two sentences.\n\n" + " ".join(words[:n])


def run_round(
    engine: Engine, shorts: list[GenerationRequest], long: GenerationRequest, arrive_after: int
) -> Round:
    out = Round()
    last: dict[str, float] = {}
    start = time.perf_counter()
    for r in shorts:
        engine.submit(r)
    steps, long_submitted = 0, 0.0
    ids = [r.request_id for r in shorts] + [long.request_id]
    while engine.has_work() or steps <= arrive_after:
        if steps == arrive_after:
            engine.submit(long)
            long_submitted = time.perf_counter()
        report = engine.step()
        steps += 1
        now = time.perf_counter()
        for ev in report.events:
            n = len(ev.token_ids)
            if ev.request_id == long.request_id:
                if n and out.ttft_long != out.ttft_long:  # first token (NaN until then)
                    out.ttft_long = now - long_submitted
                continue
            if n and ev.request_id in last:
                gap = now - last[ev.request_id]
                out.per_token.extend([gap / n] * n)
                out.max_gap = max(out.max_gap, gap)
            if n:
                last[ev.request_id] = now
    out.wall = time.perf_counter() - start
    out.outputs = {i: list(engine.pop_finished(i).output_ids) for i in ids}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--short", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--long-tokens", type=int, default=1536)
    p.add_argument("--prefill-chunk", type=int, nargs="+", default=[256])
    p.add_argument("--arrive-after", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    args = build_parser().parse_args(["demo"])
    args.max_batch = a.short + 1  # the demo's default is batch 1; here every request runs at once
    loaded = load(args)
    arms: dict[str, int | None] = {"whole": None}
    arms.update({f"chunk{c}": c for c in a.prefill_chunk})
    engines = {}
    for name, chunk in arms.items():
        args.prefill_chunk = chunk
        engines[name] = build_engine(loaded, "echo", args)
    params = SamplingParams(0.0, max_tokens=a.max_tokens, ignore_eos=True)
    shorts = [
        GenerationRequest(q.prompt_id, prompt=q.text, chat=q.chat, params=params)
        for q in mtbench(a.short)
    ]
    long = GenerationRequest(
        "long", prompt=long_prompt(loaded, a.long_tokens), params=SamplingParams(0.0, max_tokens=16)
    )
    warm = GenerationRequest("warm", prompt="Hello.", params=SamplingParams(0.0, max_tokens=8))
    for engine in engines.values():
        run_round(engine, [warm], long, 0)
    rounds: dict[str, list[Round]] = {name: [] for name in arms}
    order = list(arms)
    for r in range(a.rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:  # rotated order
            rounds[name].append(run_round(engines[name], shorts, long, a.arrive_after))
    first = rounds[order[0]][0].outputs
    prompt_len = len(
        loaded.tokenizer.apply_chat_template([{"role": "user", "content": long.prompt or ""}])
    )
    table: dict[str, dict[str, object]] = {}
    summary: dict[str, object] = {
        "cpu": cpu_name(),
        "torch_threads": a.threads,
        "short_requests": a.short,
        "max_tokens": a.max_tokens,
        "long_prompt_tokens": prompt_len,
        "arrive_after_steps": a.arrive_after,
        "rounds": a.rounds,
        "arms": table,
    }
    print(f"cpu {cpu_name()}, {a.threads} torch thread(s); ECHO, {a.short} short requests x "
          f"{a.max_tokens} tokens, one {prompt_len}-token prompt arriving at step "
          f"{a.arrive_after}; medians over {a.rounds} interleaved rounds")  # fmt: skip
    print("| arm | p50 ms/tok | p99 ms/tok | max gap ms | long TTFT ms | round wall s | outputs |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name in order:
        rs = rounds[name]
        row: dict[str, object] = {
            "p50_ms": statistics.median(1e3 * percentile(x.per_token, 50) for x in rs),
            "p99_ms": statistics.median(1e3 * percentile(x.per_token, 99) for x in rs),
            "max_gap_ms": statistics.median(1e3 * x.max_gap for x in rs),
            "ttft_long_ms": statistics.median(1e3 * x.ttft_long for x in rs),
            "wall_s": statistics.median(x.wall for x in rs),
            "per_round_p99_ms": [1e3 * percentile(x.per_token, 99) for x in rs],
            "outputs_identical": all(x.outputs == first for x in rs),
        }
        table[name] = row
        print(
            f"| {name} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['max_gap_ms']:.0f} | "
            f"{row['ttft_long_ms']:.0f} | {row['wall_s']:.2f} | "
            f"{'identical' if row['outputs_identical'] else 'DIFFER'} |"
        )
    if a.json is not None:
        a.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
