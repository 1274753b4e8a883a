"""The SGLang plugin's host time per step, ``echo`` against ``echo_device``, on the CPU (a
benchmark, not a test): ``python packages/echo-lab/scripts/plugin_step_time.py``.

Per EAGLE shape (S draft steps, top-k, verify width N) and batch B, one torch thread: a seeded
synthetic EAGLE draft (:func:`echo_sglang.synthetic.eagle_draft`, what SGLang's draft loop hands
the plugin) and, per policy, the worker's calls of one step: ``EchoStep.plan_layout`` (ECHO's
decisions over EAGLE's pool and their encoding as SGLang's padded verify input) and
``overwrite_verify_input`` (the copy into SGLang's tensors). The gate is the shipped one (its
acceptance maps, so the elastic floor's cut runs), K is the plugin's ``auto`` budget.
``--rounds`` interleaved rounds of ``--reps`` steps each (one warm-up step per policy first);
prints the median of the rounds' medians in ms with their range, and the ratio
``echo_device / echo``. This is the policy's host cost only: SGLang's own draft and verify
passes are the same for both.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from types import SimpleNamespace

import torch
from torch import Tensor

from echo_lab.bench.intervals import cpu_name
from echo_server.assets import DEFAULT_GATE
from echo_sglang.args import EchoArgs
from echo_sglang.config import EagleShape, resolve
from echo_sglang.masks import TreeMaskMode
from echo_sglang.step import EchoStep, overwrite_verify_input
from echo_sglang.synthetic import EagleLists, eagle_draft

POLICIES = ("echo", "echo_device")


def _verify_buffers(batch: int, n: int, lens: Tensor) -> SimpleNamespace:
    """SGLang's verify-input tensors the worker overwrites (their shapes in EAGLE's worker; the
    full mask covers each request's ``lens`` cached tokens and its N rows)."""
    return SimpleNamespace(
        draft_token=torch.zeros(batch * n, dtype=torch.int64),
        positions=torch.zeros(batch * n, dtype=torch.int64),
        retrieve_index=torch.zeros(batch, n, dtype=torch.int64),
        retrieve_next_token=torch.zeros(batch, n, dtype=torch.int64),
        retrieve_next_sibling=torch.zeros(batch, n, dtype=torch.int64),
        custom_mask=torch.zeros(int((n * (lens + n)).sum()), dtype=torch.uint8),
    )


def _one_step(
    lists: EagleLists, root: Tensor, lens: Tensor, buffers: SimpleNamespace, step: EchoStep
) -> None:
    """The worker's calls of one step (module docstring)."""
    layout = step.plan_layout(*lists, root, lens)
    overwrite_verify_input(buffers, layout, TreeMaskMode.FULL_MASK, prefix_filled=step.sync_free)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["4,4,8", "3,4,16", "4,8,32"],
                   help="S,k,N of EAGLE's draft (4,4,8: the real-server tier's)")  # fmt: skip
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"# {cpu_name()}, one torch thread; plugin host ms per step (plan_layout + "
          f"overwrite), median of {args.rounds} interleaved rounds' medians over {args.reps} "
          "steps [range]")  # fmt: skip
    print(f"{'S,k,N':<7} {'B':>4} " + " ".join(f"{a:>22}" for a in POLICIES) + f" {'ratio':>6}")
    for shape in args.shapes:
        s, k, n = (int(v) for v in shape.split(","))
        for b in args.batches:
            gen = torch.Generator().manual_seed(s * 1000 + b)
            lists = eagle_draft(gen, b, s, k, vocab=64)
            root, lens = torch.arange(b) + 7, torch.arange(b) % 5 + 64
            steps = {
                name: EchoStep(resolve(EchoArgs(policy=name, gate_file=str(DEFAULT_GATE)),
                                       EagleShape(s, k, n)))
                for name in POLICIES
            }  # fmt: skip
            one = functools.partial(_one_step, lists, root, lens, _verify_buffers(b, n, lens))
            for step in steps.values():
                one(step)  # warm-up
            medians: dict[str, list[float]] = {name: [] for name in POLICIES}
            for r in range(args.rounds):
                order = POLICIES if r % 2 == 0 else POLICIES[::-1]
                for name in order:
                    times = []
                    for _ in range(args.reps):
                        t0 = time.perf_counter()
                        one(steps[name])
                        times.append(1e3 * (time.perf_counter() - t0))
                    medians[name].append(statistics.median(times))
            cols = [
                f"{statistics.median(v):7.3f} [{min(v):.3f}, {max(v):.3f}]"
                for v in medians.values()
            ]
            ratio = statistics.median(medians["echo_device"]) / statistics.median(medians["echo"])
            print(f"{shape:<7} {b:>4} " + " ".join(f"{c:>22}" for c in cols) + f" {ratio:6.2f}")


if __name__ == "__main__":
    main()
