"""Self-distilled sequences as training batches, the held-out split and the draft vocabulary."""

from __future__ import annotations

import random
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from echo_lab.training.selfdistill import (
    SHARD_GLOB,
    DistilledSequence,
    is_sampled,
    prompt_of,
    read_shard,
)

HELDOUT_EVERY = 20
"""One prompt in ``HELDOUT_EVERY`` (by a hash of its id) is held out from training."""


@dataclass(frozen=True, slots=True)
class Batch:
    """Dense, right-padded sequences."""

    features: Tensor  # [B, T, H] float32
    tokens: Tensor  # [B, T+1] int64
    lengths: Tensor  # [B] int64, T_b (features per sequence)
    answer_from: Tensor  # [B] int64, prompt length (first generated token's index)
    aux: Tensor | None = None  # [B, T, L*H] float32, target residual streams (when recorded)

    @property
    def num_rows(self) -> int:
        return int(self.lengths.sum())


def load_sequences(data_dir: Path) -> list[DistilledSequence]:
    shards = sorted(data_dir.glob(SHARD_GLOB))
    if not shards:
        raise FileNotFoundError(f"no {SHARD_GLOB} in {data_dir}: run the generation stage first")
    return [s for shard in shards for s in read_shard(shard)]


def is_heldout(sequence_id: str) -> bool:
    """Whether the prompt a sequence answers is held out (a hash of the prompt id, so its
    sampled continuations go with it)."""
    return zlib.crc32(prompt_of(sequence_id).encode()) % HELDOUT_EVERY == 0


def split(
    seqs: Sequence[DistilledSequence],
) -> tuple[list[DistilledSequence], list[DistilledSequence]]:
    """(train, held-out), each sorted by sequence id so the order is independent of shard
    order. Held-out: the greedy answers of held-out prompts only (teacher-forced agreement
    compares with the target's greedy token); their sampled continuations are used nowhere."""
    ordered = sorted(seqs, key=lambda s: s.prompt_id)
    train = [s for s in ordered if not is_heldout(s.prompt_id)]
    return train, [s for s in ordered if is_heldout(s.prompt_id) and not is_sampled(s.prompt_id)]


def check_fraction(fraction: float) -> None:
    """Raise ValueError unless ``fraction`` lies in (0, 1] (:func:`subsample`'s argument)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"the training fraction must lie in (0, 1], got {fraction}")


def subsample(
    train: Sequence[DistilledSequence], fraction: float, seed: int = 0
) -> list[DistilledSequence]:
    """The training sequences of a seeded random ``fraction`` of the training prompts (a
    prompt's sampled continuations go with it), in ``train``'s order: ``round(fraction P)``
    of the ``P`` prompts, at least one. Nested: with one seed, a smaller fraction keeps a
    subset of a larger one's prompts (a data-scaling study compares heads on growing data)."""
    check_fraction(fraction)
    prompts = sorted({prompt_of(s.prompt_id) for s in train})
    random.Random(seed).shuffle(prompts)
    kept = set(prompts[: max(1, round(fraction * len(prompts)))])
    return [s for s in train if prompt_of(s.prompt_id) in kept]


def answer_tokens(seqs: Sequence[DistilledSequence]) -> Iterator[int]:
    """Every token the target generated (what a drafter must predict)."""
    for s in seqs:
        yield from s.tokens[s.prompt_len :]


def draft_vocabulary(
    seqs: Sequence[DistilledSequence], size: int, special: Sequence[int] = ()
) -> Tensor:
    """The ``size`` most frequent generated tokens (ties by id), ``special`` first: [size] int64.

    Falls back to prompt tokens, then to the lowest unused ids, when the answers hold fewer.
    """
    counts = Counter(answer_tokens(seqs))
    prompt_counts = Counter(t for s in seqs for t in s.tokens[: s.prompt_len])
    ranked = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    ranked += [t for t, _ in sorted(prompt_counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    out: list[int] = []
    seen: set[int] = set()
    for t in [*special, *ranked]:
        if t not in seen:
            out.append(t)
            seen.add(t)
    filler = 0
    while len(out) < size:
        if filler not in seen:
            out.append(filler)
        filler += 1
    return torch.tensor(sorted(out[:size]), dtype=torch.int64)


def coverage(seqs: Sequence[DistilledSequence], vocab: Tensor) -> float:
    """Fraction of generated tokens that lie in ``vocab``."""
    ids = set(vocab.tolist())
    toks = list(answer_tokens(seqs))
    return sum(t in ids for t in toks) / max(len(toks), 1)


def make_batch(seqs: Sequence[DistilledSequence], with_aux: bool = False) -> Batch:
    """Pad ``seqs`` into a :class:`Batch`; ``with_aux`` adds their aux features (ValueError if a
    sequence has none)."""
    t = max(s.features.shape[0] for s in seqs)
    h = seqs[0].features.shape[1]
    feats = torch.zeros(len(seqs), t, h)
    tokens = torch.zeros(len(seqs), t + 1, dtype=torch.int64)
    aux: Tensor | None = None
    if with_aux:
        if any(s.aux is None for s in seqs):
            raise ValueError("the head reads aux features but some sequences have none recorded")
        aux = torch.zeros(len(seqs), t, seqs[0].aux.shape[1])  # type: ignore[union-attr]
    for i, s in enumerate(seqs):
        n = s.features.shape[0]
        feats[i, :n] = s.features.float()
        tokens[i, : n + 1] = torch.tensor(s.tokens, dtype=torch.int64)
        if aux is not None and s.aux is not None:
            aux[i, :n] = s.aux.float()
    return Batch(
        features=feats,
        tokens=tokens,
        lengths=torch.tensor([s.features.shape[0] for s in seqs], dtype=torch.int64),
        answer_from=torch.tensor([s.prompt_len for s in seqs], dtype=torch.int64),
        aux=aux,
    )


def batches(
    seqs: Sequence[DistilledSequence], max_tokens: int, seed: int | None = None
) -> list[list[DistilledSequence]]:
    """Group sequences of similar length into batches of at most ``max_tokens`` padded rows;
    shuffled batch order with ``seed`` (None keeps length order)."""
    ordered = sorted(seqs, key=lambda s: (s.features.shape[0], s.prompt_id))
    groups: list[list[DistilledSequence]] = []
    current: list[DistilledSequence] = []
    for s in ordered:
        longest = max([s.features.shape[0], *(x.features.shape[0] for x in current)])
        if current and longest * (len(current) + 1) > max_tokens:
            groups.append(current)
            current = []
        current.append(s)
    if current:
        groups.append(current)
    if seed is not None:
        random.Random(seed).shuffle(groups)
    return groups
