"""Mean accepted length of ECHO's draft head inside a real SGLang server and in ECHO's own engine,
on the same prompts (as token ids), greedy, batch 1, float32 on both sides.

    .venv/bin/python packages/echo-lab/scripts/sglang_acceptance.py \\
        [--num-prompts 10] [--max-new-tokens 64] [--out docs/bench/DATE/sglang-acceptance]

MAL = output tokens / verify passes, summed over the requests of a set (the first output token,
from the prefill, counts as an output token on both sides). Rows:

- ``sglang eagle3``: SGLang's own EAGLE-3 worker with ECHO's head exported as an SGLang draft
  (echo_lab.sglang.harness, its tree ``TREE``: 4 steps, top-k 4, 8 draft tokens incl. the root);
- ``sglang echo``: the ECHO plugin over the same EAGLE pool, with the plugin's defaults
  (``--speculative-echo-budget auto`` and no knee: K = B (N - 1) = 7 at batch 1; depth and width
  from the EAGLE flags; no cost floor) and the harness's gate file;
- ``engine eagle2``: echo-server's engine, the shipped EAGLE head alone (float32),
  ``PolicyConfig(base_depth=4, topk=4, num_draft_tokens=8)``, K = 7;
- ``engine echo``: the same engine and head, ECHO with the plugin's own ``PolicyConfig``
  (``max_depth=4, max_width=4``), the same gate, K = 7 (a fixed budget) and no elastic floor;
- ``engine echo-cap7`` (a diagnostic row): ``engine echo`` with every request's node cap
  ``StepBatch.max_nodes`` clamped to ``N - 1 = 7`` (:class:`CappedPolicy`), as the plugin sets it.
  The engine has no knob for that cap: it passes ``remaining - 1`` (up to 63 here), which K = 7
  makes equivalent for the selection but not for ECHO's drafting (a request whose band holds its
  cap is not expanded further, while a full budget still lets children that could beat the
  weakest kept node be drafted: echo_scheduler.policies.echo ``_next_plan``).

Only one SGLang server runs at a time (each is closed before the next starts: SGLang's idle
scheduler polls a core), and the engine runs after both are closed. The table (with ratios
SGLang / engine for eagle3 / eagle2 and echo / echo), the per-request counts and every
configuration are printed and written to ``OUT/epyc.txt`` and ``OUT/epyc.json``; greedy outputs
of every row are compared token for token with SGLang's EAGLE-3 ones. Needs
``bash scripts/sglang/setup_env.sh`` first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from echo_core.sampling import SamplingParams
from echo_core.tree import TreeBatch
from echo_gating.policy import GatePolicy
from echo_lab.sglang.harness import CACHE, REPO, TREE, Environment, server_command, start_server
from echo_scheduler.config import PolicyConfig
from echo_scheduler.interface import DraftPlan, Policy, StepBatch, StepOutcome
from echo_scheduler.policies import make_policy
from echo_server.drafting.eagle_drafter import eagle_drafter_for
from echo_server.engine import Engine, EngineConfig, GenerationRequest
from echo_server.model.loader import LoadedModel, load_model
from echo_server.prompts import Prompt, humaneval, mtbench

SETS = ("humaneval", "mtbench")
NODES = TREE["draft_tokens"] - 1
"""Draft nodes per request (the root not counted): SGLang's padded verify width less one."""
ROWS = (
    ("sglang", "eagle3"),
    ("sglang", "echo"),
    ("engine", "eagle2"),
    ("engine", "echo"),
    ("engine", f"echo-cap{NODES}"),
)
PAIRS = {("sglang", "eagle3"): ("engine", "eagle2"), ("sglang", "echo"): ("engine", "echo")}
"""Each SGLang row and the engine row with the same tree limits (the ratio's denominator)."""
REFERENCE = ("sglang", "eagle3")
"""The row every other row's greedy output is compared with."""
DEFAULT_OUT = REPO / "docs/bench/2026-12-06/sglang-acceptance"


@dataclass(frozen=True, slots=True)
class Request:
    """One prompt as token ids, and which set it belongs to."""

    prompt_id: str
    set: str
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request's result in one row: its output ids and the verify passes it took."""

    output_ids: tuple[int, ...]
    verify_passes: int

    @property
    def tokens(self) -> int:
        return len(self.output_ids)


def prompts(model_dir: Path, n: int) -> list[Request]:
    """The first ``n`` HumanEval problems (raw) and MT-Bench first turns (chat template), as
    token ids of the exported model's tokenizer (tests/sglang_server/test_serving.py's way)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    chosen: list[tuple[str, Prompt]] = [
        *(("humaneval", p) for p in humaneval(n)),
        *(("mtbench", p) for p in mtbench(n)),
    ]
    out = []
    for name, p in chosen:
        text = p.text
        if p.chat:
            text = str(
                tok.apply_chat_template(
                    [{"role": "user", "content": p.text}],
                    add_generation_prompt=True,
                    tokenize=False,
                )
            )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        out.append(Request(p.prompt_id, name, tuple(int(t) for t in ids)))
    return out


def run_sglang(
    env: Environment, mode: str, requests: Sequence[Request], new_tokens: int, log_dir: Path
) -> tuple[dict[str, Outcome], str]:
    """Every request through a fresh ``mode`` server, one at a time; (outcomes, log path)."""
    server = start_server(env, mode, log_dir)
    try:
        out = {}
        for r in requests:
            body = server.generate(r.ids, new_tokens)
            meta = body["meta_info"]
            ids = tuple(int(t) for t in body["output_ids"])
            if int(meta["completion_tokens"]) != len(ids):
                raise RuntimeError(
                    f"{mode} {r.prompt_id}: completion_tokens {meta['completion_tokens']} "
                    f"!= {len(ids)} output ids"
                )
            out[r.prompt_id] = Outcome(ids, int(meta.get("spec_verify_ct", 0)))
            print(f"  sglang {mode:<7} {r.prompt_id:<14} {_mal(out[r.prompt_id]):.2f}", flush=True)
        return out, str(server.log)
    finally:
        server.close()


def policy_configs() -> dict[str, PolicyConfig]:
    """The engine's two policy configurations (module docstring): eagle2 with SGLang's EAGLE tree,
    echo with the plugin's own (echo_sglang.config.resolve with the harness's flags)."""
    steps, topk, n = TREE["steps"], TREE["topk"], TREE["draft_tokens"]
    return {
        "eagle2": PolicyConfig(base_depth=steps, topk=topk, num_draft_tokens=n),
        "echo": PolicyConfig(
            base_depth=steps, topk=topk, num_draft_tokens=n, max_depth=steps, max_width=topk
        ),
    }


class CappedPolicy:
    """``inner`` with every request's node cap (``StepBatch.max_nodes``) clamped to ``cap``: the
    plugin's per-request cap ``N - 1`` in the engine, which passes ``remaining - 1``."""

    def __init__(self, inner: Policy, cap: int) -> None:
        self.inner, self.cap = inner, cap
        self.name = f"{inner.name}-cap{cap}"

    def begin_step(self, batch: StepBatch) -> DraftPlan:
        capped = dataclasses.replace(batch, max_nodes=batch.max_nodes.clamp(max=self.cap))
        return self.inner.begin_step(capped)

    def after_depth(self, pool: TreeBatch) -> DraftPlan:
        return self.inner.after_depth(pool)

    def select(self, pool: TreeBatch) -> Tensor:
        return self.inner.select(pool)

    def observe(self, outcome: StepOutcome) -> None:
        self.inner.observe(outcome)

    def active_gate(self) -> GatePolicy | None:
        return self.inner.active_gate()

    def set_gate(self, gate: GatePolicy) -> bool:
        return self.inner.set_gate(gate)


def run_engine(
    loaded: LoadedModel,
    policy: str,
    config: PolicyConfig,
    gate: GatePolicy | None,
    requests: Sequence[Request],
    new_tokens: int,
) -> dict[str, Outcome]:
    """Every request through a fresh engine (float32 head alone, K = ``NODES``, no floor), one at
    a time; ``policy`` ``NAME-cap7``: NAME under :class:`CappedPolicy` at ``NODES``."""
    name, capped = policy.removesuffix(f"-cap{NODES}"), policy.endswith(f"-cap{NODES}")
    built: Policy = make_policy(name, config, gate)
    engine = Engine(
        loaded.model,
        loaded.tokenizer,
        CappedPolicy(built, NODES) if capped else built,
        eagle_drafter_for(loaded.model, None, dtype=torch.float32),
        EngineConfig(budget=NODES, max_batch=1, elastic=False, profile_cache=None),
    )
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens)
    out = {}
    for r in requests:
        engine.submit(GenerationRequest(r.prompt_id, prompt_ids=r.ids, params=params))
        while engine.has_work():
            for ev in engine.step().events:
                if ev.error is not None:
                    raise RuntimeError(f"engine {policy} {r.prompt_id}: {ev.error}")
        state = engine.pop_finished(r.prompt_id)
        out[r.prompt_id] = Outcome(tuple(state.output_ids), state.steps)
        print(f"  engine {policy:<7} {r.prompt_id:<14} {_mal(out[r.prompt_id]):.2f}", flush=True)
    return out


def _mal(*outcomes: Outcome) -> float:
    steps = sum(o.verify_passes for o in outcomes)
    return sum(o.tokens for o in outcomes) / steps if steps else float("nan")


@dataclass(frozen=True, slots=True)
class Row:
    """One (place, policy) row of the table: MAL per set and over all (``all``), and for an
    SGLang row its ratio to the matching engine row (None for the engine rows)."""

    place: str
    policy: str
    mal: dict[str, float]
    ratio: dict[str, float] | None


def summary(
    results: dict[tuple[str, str], dict[str, Outcome]], requests: Sequence[Request]
) -> list[Row]:
    """The table's rows (:class:`Row`), in ``ROWS`` order."""
    mals = {}
    for key in ROWS:
        res = results[key]
        mal = {s: _mal(*(res[r.prompt_id] for r in requests if r.set == s)) for s in SETS}
        mal["all"] = _mal(*res.values())
        mals[key] = mal
    rows = []
    for key in ROWS:
        pair = PAIRS.get(key)
        ratio = None if pair is None else {s: mals[key][s] / mals[pair][s] for s in mals[key]}
        rows.append(Row(key[0], key[1], mals[key], ratio))
    return rows


def mismatches(
    results: dict[tuple[str, str], dict[str, Outcome]], requests: Sequence[Request]
) -> dict[str, list[dict[str, Any]]]:
    """Per row (and per matching pair), the requests whose greedy output differs from the
    reference's: where they first differ and both lengths."""
    out: dict[str, list[dict[str, Any]]] = {}
    pairs = [(REFERENCE, k) for k in ROWS if k != REFERENCE] + list(PAIRS.items())
    for a, b in pairs:
        diff = []
        for r in requests:
            x, y = results[a][r.prompt_id].output_ids, results[b][r.prompt_id].output_ids
            if x != y:
                first = next((i for i, (s, t) in enumerate(zip(x, y, strict=False)) if s != t),
                             min(len(x), len(y)))  # fmt: skip
                diff.append({"prompt": r.prompt_id, "first_diff": first, "len": [len(x), len(y)]})
        out[f"{' '.join(a)} vs {' '.join(b)}"] = diff
    return out


def cpu_name() -> str:
    """lscpu's model name (then /proc/cpuinfo's, then platform's)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in text.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or platform.machine()


def render(
    rows: list[Row],
    results: dict[tuple[str, str], dict[str, Outcome]],
    requests: Sequence[Request],
    diff: dict[str, list[dict[str, Any]]],
    header: Sequence[str],
) -> str:
    """The printed report: header lines, the MAL table, mismatches, per-request counts."""
    lines = [*header, ""]
    lines.append(
        f"{'place':<7} {'policy':<9} {'MAL HumanEval':>13} {'MAL MT-Bench':>12} {'MAL all':>8}"
        f"  {'SGLang/engine (HE / MT / all)':<30}"
    )
    for row in rows:
        m, ratio = row.mal, row.ratio
        rs = "" if ratio is None else " / ".join(f"{ratio[s]:.3f}" for s in (*SETS, "all"))
        lines.append(
            f"{row.place:<7} {row.policy:<9} {m['humaneval']:>13.3f} "
            f"{m['mtbench']:>12.3f} {m['all']:>8.3f}  {rs}"
        )
    lines += ["", "greedy output vs reference (requests that differ):"]
    for name, d in diff.items():
        detail = ", ".join(f"{x['prompt']}@{x['first_diff']} {x['len']}" for x in d)
        lines.append(f"  {name}: {len(d)} of {len(requests)}" + (f" ({detail})" if d else ""))
    lines += ["", "per request: output tokens / verify passes"]
    lines.append(f"{'prompt':<14} " + " ".join(f"{' '.join(k):>17}" for k in ROWS))
    for r in requests:
        cells = [results[k][r.prompt_id] for k in ROWS]
        lines.append(
            f"{r.prompt_id:<14} "
            + " ".join(f"{f'{c.tokens}/{c.verify_passes}':>17}" for c in cells)
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-prompts", type=int, default=10, help="prompts per set")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--name", default="epyc", help="file stem of the outputs in --out")
    p.add_argument("--threads", type=int, default=None, help="the engine's torch CPU threads")
    args = p.parse_args(argv)
    start = time.perf_counter()
    env = Environment.default()
    problem = env.problem()
    if problem is not None:
        raise SystemExit(problem)
    if args.threads:
        torch.set_num_threads(args.threads)
    requests = prompts(env.model, args.num_prompts)
    log_dir = CACHE / "sglang-logs"
    results: dict[tuple[str, str], dict[str, Outcome]] = {}
    logs: dict[str, str] = {}
    for mode in ("eagle3", "echo"):
        results[("sglang", mode)], logs[mode] = run_sglang(
            env, mode, requests, args.max_new_tokens, log_dir
        )
    loaded = load_model(None, dtype=torch.float32)
    gate = GatePolicy.load(env.gate) if env.gate is not None else None
    configs = policy_configs()
    for policy in ("eagle2", "echo", f"echo-cap{NODES}"):
        base = policy.split("-")[0]
        results[("engine", policy)] = run_engine(
            loaded, policy, configs[base], gate if base == "echo" else None, requests,
            args.max_new_tokens,
        )  # fmt: skip
    rows = summary(results, requests)
    diff = mismatches(results, requests)
    command = shlex.join([sys.executable, *sys.argv])
    cpu = cpu_name()
    header = [
        f"ECHO head MAL, SGLang server vs echo-server engine; CPU: {cpu} "
        f"({torch.get_num_threads()} engine threads); greedy, batch 1, "
        f"{args.max_new_tokens} new tokens, {args.num_prompts} HumanEval (raw) + "
        f"{args.num_prompts} MT-Bench first turns (chat), float32",
        f"SGLang tree: steps {TREE['steps']}, topk {TREE['topk']}, draft_tokens "
        f"{TREE['draft_tokens']}; engine K = {NODES}, no elastic floor, head alone (float32); "
        f"gate {env.gate.name if env.gate else None}; engine echo-cap{NODES}: per-request cap "
        f"clamped to N - 1 = {NODES} as in the plugin (the engine passes remaining - 1)",
        f"command: {command}",
    ]
    text = render(rows, results, requests, diff, header)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": "echo-sglang-acceptance/1",
        "cpu": cpu,
        "command": command,
        "wall_s": round(time.perf_counter() - start, 1),
        "max_new_tokens": args.max_new_tokens,
        "num_prompts_per_set": args.num_prompts,
        "engine_threads": torch.get_num_threads(),
        "config": {
            "sglang_commands": {
                m: server_command(env, m, 0)[1:] for m in ("eagle3", "echo")
            },  # port 0: a placeholder
            "sglang_logs": logs,
            "engine": {
                "budget": NODES,
                "elastic": False,
                "drafter": "eagle (shipped head alone), float32",
                "policies": {k: asdict(v) for k, v in configs.items()},
                "gate": {"eagle2": None, "echo": str(env.gate)},
                "per_request_cap": {
                    "eagle2": "min(N - 1, K // B, remaining - 1) (uniform_caps)",
                    "echo": "remaining - 1 (engine; K = 7 bounds the total)",
                    f"echo-cap{NODES}": f"min(remaining - 1, {NODES}) (CappedPolicy)",
                },
            },
        },
        "rows": [asdict(r) for r in rows],
        "mismatches": diff,
        "requests": [
            {
                "prompt": r.prompt_id,
                "set": r.set,
                "prompt_tokens": len(r.ids),
                **{
                    " ".join(k): {
                        "tokens": results[k][r.prompt_id].tokens,
                        "verify_passes": results[k][r.prompt_id].verify_passes,
                    }
                    for k in ROWS
                },
            }
            for r in requests
        ],
        "outputs": {
            " ".join(k): {pid: list(o.output_ids) for pid, o in results[k].items()} for k in ROWS
        },
    }
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / f"{args.name}.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
