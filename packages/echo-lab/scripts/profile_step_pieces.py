"""Where a decode step's time goes beyond the model: wall ms per decode step of every piece.

One engine (``--policy``, the embedded default) serves ``--num-prompts`` prompts of one workload
at ``--concurrency`` (greedy, ``--max-tokens``); the engine's, the driver's, the drafter's, the
head's and the policy's methods are wrapped with ``perf_counter`` (about 1 us each, far below
cProfile's distortion) and their totals printed per decode step, largest first. Nested pieces
are each counted in full (``drafter.expand`` holds ``drafter._catch_up``, which holds
``head.fuse``...). ``--warm`` serves the prompts once untimed first, so the policy's ledger has
learned. The CPU attention's pieces are wrapped too (``attention.plan``, ``attention.sdpa``,
``attention.pool_gather+sdpa`` for groups read from the pool, ``mirror.next_layer`` (its growth) and
``mirror.copy`` for the lane mirrors); ``--gather`` runs the model's attention without mirrors
(every layer gathers from the pool, as before 2026-12-05) and ``--min-context N`` reads groups
from the mirrors from context N on (the default: ``kv_mirror.MIN_CONTEXT``). ``--prompts FILE``
serves a JSONL of prompts instead of ``--workload``. A profile, not a speed ratio: one engine, no
interleaving.

    .venv/bin/python packages/echo-lab/scripts/profile_step_pieces.py --workload humaneval \\
        --concurrency 1 --num-prompts 6
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import echo_scheduler.device.driver as device_driver
import echo_scheduler.driver as driver
import echo_server.drafting.eagle_drafter as eagle_drafter
import echo_server.drafting.eagle_head as eagle_head
import echo_server.engine.draft_source as draft_source
import echo_server.engine.engine as engine_module
import echo_server.engine.speculate as speculate
import echo_server.engine.verify as verify
import echo_server.model.kv_mirror as kv_mirror
import echo_server.model.torch_attention as torch_attention
from echo_core.sampling import SamplingParams
from echo_lab.bench.intervals import cpu_name
from echo_lab.bench.workloads import load_workloads
from echo_lab.cli.bench import _factory
from echo_server.cli import build_parser
from echo_server.cli.options import load
from echo_server.engine import Engine, GenerationRequest
from echo_server.model.llama import default_mirror

SECONDS: collections.Counter[str] = collections.Counter()
CALLS: collections.Counter[str] = collections.Counter()


def wrap(owner: Any, name: str, label: str, *aliases: Any) -> None:
    """Time ``owner.name`` under ``label`` (also where ``aliases`` imported it by name)."""
    inner: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(inner)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SECONDS[label] += time.perf_counter() - start
            CALLS[label] += 1

    setattr(owner, name, timed)
    for module in aliases:
        setattr(module, name, timed)


def instrument(engine: Engine) -> None:
    wrap(speculate, "speculate", "engine.speculate", engine_module)
    wrap(engine_module.Engine, "_commit_and_emit", "engine._commit_and_emit")
    wrap(verify, "verify_pass", "verify_pass", speculate)
    wrap(device_driver, "drive", "driver.drive", speculate)
    wrap(driver, "drive_step", "drive_step", device_driver)
    wrap(driver, "check_plan", "driver.check_plan")
    wrap(driver, "check_selection", "driver.check_selection", device_driver)
    wrap(draft_source, "grow_pool", "grow_pool")
    wrap(draft_source, "expand_request", "expand_request")
    wrap(speculate, "accept", "accept")
    for name in ("commit_verified", "kept_rows", "feedback", "apply_new_tokens"):
        wrap(engine_module, name, name)
    for name in ("expand", "observe", "_catch_up", "_root_logprobs", "_run_nodes", "_proposals"):
        wrap(eagle_drafter.EagleDrafter, name, f"drafter.{name}")
    for name in ("fuse", "project", "finish", "logits"):
        wrap(eagle_head.EagleHead, name, f"head.{name}")
    wrap(torch_attention.TorchAttention, "plan", "attention.plan")
    wrap(torch_attention, "_sdpa_dense", "attention.sdpa")
    wrap(torch_attention, "_attend_dense", "attention.pool_gather+sdpa")
    wrap(kv_mirror.MirrorState, "next_layer", "mirror.next_layer")
    wrap(kv_mirror.MirrorCopies, "apply", "mirror.copy")
    model = type(engine.model)
    wrap(model, "forward", "model.forward (prefill too)")
    wrap(model, "logits", "model.logits (prefill too)")
    for name in ("begin_step", "after_depth", "select", "begin_fixed", "fixed_depth",
                 "fixed_select", "observe"):  # fmt: skip
        if hasattr(engine.policy, name):
            wrap(engine.policy, name, f"policy.{name}")


def serve(engine: Engine, prompts: list[Any], tag: str, max_tokens: int) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    for i, prompt in enumerate(prompts):
        engine.submit(GenerationRequest(f"{tag}{i}", prompt=prompt.text, params=params))
    while engine.has_work():
        engine.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="humaneval")
    p.add_argument("--policy", default="echo")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--num-prompts", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--warm", action="store_true", help="serve the prompts once untimed first")
    p.add_argument("--gather", action="store_true", help="attention without lane mirrors")
    p.add_argument("--min-context", type=int, default=None, help="mirror from this context on")
    p.add_argument("--prompts", type=Path, default=None, help="JSONL prompts (not --workload)")
    a = p.parse_args()
    torch.set_num_threads(1)
    argv = ["bench", "--threads", "1", "--max-tokens", str(a.max_tokens), "--workloads", a.workload]
    args = build_parser().parse_args(argv)
    names = [] if a.prompts is not None else args.workloads
    workloads = load_workloads(names, a.num_prompts, a.prompts)
    loaded = load(args)
    if a.gather:
        loaded.model.attention = torch_attention.TorchAttention()
    elif a.min_context is not None:
        mirror = default_mirror(loaded.model.config, loaded.model.dtype)
        config = dataclasses.replace(mirror, min_context=a.min_context)
        loaded.model.attention = torch_attention.TorchAttention(mirror=config)
    engine: Engine = _factory(loaded, args, workloads)(a.policy, a.concurrency)
    prompts = list(workloads[0].prompts)
    if a.warm:
        serve(engine, prompts, "warm", a.max_tokens)
    instrument(engine)
    serve(engine, prompts, "timed", a.max_tokens)
    steps = CALLS["engine.speculate"]
    print(
        f"# {workloads[0].name} {a.policy} c={a.concurrency}, {a.num_prompts} prompts, "
        f"{a.max_tokens} tokens; {cpu_name()}, one thread; {steps} decode steps"
        + ("; attention gathers from the pool" if a.gather else "")
        + (f"; mirrors from context {a.min_context}" if a.min_context is not None else "")
    )
    for label, seconds in SECONDS.most_common():
        print(f"{label:34s} {1000 * seconds / steps:8.3f} ms/step  {CALLS[label]:6d} calls")


if __name__ == "__main__":
    main()
