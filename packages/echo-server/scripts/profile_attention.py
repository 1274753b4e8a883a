"""How much of a decode step is the CPU attention backend: wall, verify and attention ms per step.

Plain decoding and ECHO (the embedded default) each serve ``--batch`` MT-Bench prompts at once
for ``--max-tokens`` tokens (EOS ignored); after the prefill step, the time inside
``TorchAttention.plan`` and ``.attend`` (every layer of the target's forwards) is summed and
divided by the decode steps. One pass each, not interleaved: a profile, not a speed ratio.

    .venv/bin/python packages/echo-server/scripts/profile_attention.py [--batch 8]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

from echo_core.sampling import SamplingParams
from echo_server.bench.intervals import cpu_name
from echo_server.cli import build_parser
from echo_server.cli.options import build_engine, load
from echo_server.engine import GenerationRequest
from echo_server.model.torch_attention import TorchAttention
from echo_server.prompts import mtbench

SPENT = {"attend": 0.0, "plan": 0.0}


def _timed(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            SPENT[name] += time.perf_counter() - start

    return wrapper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=48)
    a = p.parse_args()
    torch.set_num_threads(1)
    TorchAttention.attend = _timed("attend", TorchAttention.attend)  # type: ignore[method-assign]
    TorchAttention.plan = _timed("plan", TorchAttention.plan)  # type: ignore[method-assign]
    args = build_parser().parse_args(["demo"])
    args.max_batch = a.batch
    loaded = load(args)
    print(f"cpu {cpu_name()}, 1 torch thread, batch {a.batch}, {a.max_tokens} tokens each")
    for policy in ("plain", "echo"):
        engine = build_engine(loaded, policy, args)
        params = SamplingParams(0.0, max_tokens=a.max_tokens, ignore_eos=True)
        for q in mtbench(a.batch):
            engine.submit(GenerationRequest(q.prompt_id, prompt=q.text, params=params))
        engine.step()  # prefill (and the first decode step)
        SPENT.update(attend=0.0, plan=0.0)
        engine.metrics.reset()
        start = time.perf_counter()
        while engine.has_work():
            engine.step()
        wall, m = time.perf_counter() - start, engine.metrics
        n = max(m.steps, 1)
        print(
            f"{policy}: {m.steps} steps, ms per step: wall {1e3 * wall / n:.1f}, verify "
            f"{1e3 * m.phase_seconds['verify'] / n:.1f}, attention {1e3 * SPENT['attend'] / n:.1f}"
            f" (+ plan {1e3 * SPENT['plan'] / n:.1f})"
        )


if __name__ == "__main__":
    main()
