"""Held-out teacher-forced top-1 agreement of several draft heads on one self-distilled split.

``echo-sd train-draft`` reports the agreement of the head it trains on its own held-out split
(``<out>.train.json``). Two heads trained on different data have different splits, so their
reports do not compare; this script scores every head given on the held-out split of one work
directory (the greedy answers of the prompts whose id hashes into the held-out set,
:func:`echo_lab.training.dataset.split`), none of which any head trained on as long as both
work directories came from ``build_prompts`` with the same seed (held-out membership is a hash
of the prompt id, so it does not depend on the prompt count).

Per head and depth k = 1..``--depths``: the share of held-out generated positions where the
head's depth-k draft, reading its own depth k-1 prediction, equals the target's greedy token;
and the share where depths 1..k all agree (:func:`echo_lab.training.trainer.agreement`). Then
the same per prompt kind of the held-out split (``code``, ``writing``, ...: the prompt id's
prefix), and on the benchmark sets themselves (``--bench``): the target's greedy answers to
their first ``--bench-prompts`` prompts, generated once into ``<work-dir>/bench-<set>`` with the
work dir's aux layers. The benchmark rows say how far agreement carries from the training
distribution to the prompts the speedups are measured on.

    .venv/bin/python packages/echo-lab/scripts/heldout_agreement.py \\
        --work-dir ~/.cache/echo-sd/train-3k --head old.safetensors new.safetensors \\
        --bench humaneval mtbench
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from echo_lab.training.dataset import load_sequences, split
from echo_lab.training.selfdistill import DistilledSequence, generate_dataset, stored_aux_layers
from echo_lab.training.trainer import agreement
from echo_server.drafting.eagle_checkpoint import load_head
from echo_server.drafting.eagle_head import EagleHead
from echo_server.model.loader import LoadedModel, load_model
from echo_server.prompts import humaneval, mtbench

BENCH_SETS = {"humaneval": humaneval, "mtbench": mtbench}


def bench_sequences(
    loaded: LoadedModel, work: Path, name: str, prompts: int, tokens: int
) -> list[DistilledSequence]:
    """The target's greedy answers to the first ``prompts`` prompts of benchmark set ``name``,
    with the work dir's features (generated once, then read back)."""
    out = work / f"bench-{name}"
    layers = stored_aux_layers(work / "data") or ()
    generate_dataset(loaded, BENCH_SETS[name](prompts), out, tokens, 16, aux_layers=layers)
    return load_sequences(out)


def _row(label: str, head: EagleHead, seqs: list[DistilledSequence], depths: int) -> str:
    got = agreement(head, seqs, depths)
    return (
        f"{label[-48:]:<48} "
        + " ".join(f"{a:>8.3f}" for a in got.top1)
        + " "
        + " ".join(f"{a:>8.3f}" for a in got.chain)
        + f"  ({got.rows} rows)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work-dir", type=Path, required=True, help="train-draft's --work-dir")
    p.add_argument("--head", type=Path, nargs="+", required=True, help="heads (.safetensors)")
    p.add_argument("--depths", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bench", nargs="*", choices=sorted(BENCH_SETS), default=[])
    p.add_argument("--bench-prompts", type=int, default=32)
    p.add_argument("--bench-tokens", type=int, default=96)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    _, heldout = split(load_sequences(args.work_dir / "data"))
    loaded = load_model(None)
    weights = loaded.model.weights
    sets: dict[str, list[DistilledSequence]] = {"held-out": heldout}
    for seq in heldout:
        sets.setdefault("held-out " + seq.prompt_id.split("/")[0], []).append(seq)
    for name in args.bench:
        sets[name] = bench_sequences(
            loaded, args.work_dir, name, args.bench_prompts, args.bench_tokens
        )
    if any(s.aux is None for seqs in sets.values() for s in seqs):
        raise SystemExit("some sequences lack the aux features the heads read")
    heads = [(str(path), load_head(path, weights.embed, weights.lm_head)) for path in args.head]
    ks = range(1, args.depths + 1)
    header = " ".join(f"{'top1@' + str(k):>8}" for k in ks) + " "
    header += " ".join(f"{'chain@' + str(k):>8}" for k in ks)
    for name, seqs in sets.items():
        positions = sum(len(s.tokens) - 1 - s.prompt_len for s in seqs)
        print(f"\n{name}: {len(seqs)} sequences, {positions} generated tokens")
        print(f"{'head':<48} {header}")
        for label, head in heads:
            print(_row(label, head, seqs, args.depths))


if __name__ == "__main__":
    main()
