"""Draft vocabulary, held-out split and batching of self-distilled sequences."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from echo_lab.training.dataset import (
    batches,
    coverage,
    draft_vocabulary,
    make_batch,
    split,
    subsample,
)
from echo_lab.training.selfdistill import DistilledSequence
from echo_lab.training.testing import sequences


def test_draft_vocabulary_takes_frequent_generated_tokens_and_specials() -> None:
    seqs = [DistilledSequence("a", [9, 9, 1, 1, 1, 2, 2, 3], torch.zeros(7, 4), 2)]
    vocab = draft_vocabulary(seqs, 3, special=[7])
    assert vocab.tolist() == [1, 2, 7]
    assert coverage(seqs, vocab) == 5 / 6


def test_draft_vocabulary_fills_up_to_its_size() -> None:
    seqs = [DistilledSequence("a", [5, 6], torch.zeros(1, 4), 1)]
    assert draft_vocabulary(seqs, 4).tolist() == [0, 1, 5, 6]


def test_split_is_by_prompt_id_and_independent_of_order() -> None:
    seqs = sequences(60, 4, 11)
    train, held = split(seqs)
    assert held
    assert len(train) + len(held) == 60
    assert split(list(reversed(seqs))) == (train, held)


def test_a_held_out_prompts_sampled_continuations_are_used_nowhere() -> None:
    """Sampled continuations follow their prompt into the split; held-out keeps only greedy
    answers (its agreement is against the target's greedy token)."""
    base = sequences(60, 4, 11)
    sampled = [dataclasses.replace(s, prompt_id=f"{s.prompt_id}~s1") for s in base]
    train, held = split([*base, *sampled])
    assert {s.prompt_id for s in held} == {s.prompt_id for s in split(base)[1]}
    held_prompts = {s.prompt_id for s in held}
    assert not any(s.prompt_id.split("~s")[0] in held_prompts for s in train)
    assert len(train) == 2 * len(split(base)[0])


def test_subsample_keeps_whole_prompts_nested_and_in_order() -> None:
    """A fraction of the training prompts, with their sampled continuations; one seed nests
    the fractions; the order is the input's; a fraction outside (0, 1] is refused."""
    base = sequences(80, 4, 11)
    sampled = [dataclasses.replace(s, prompt_id=f"{s.prompt_id}~s1") for s in base]
    train = split([*base, *sampled])[0]
    prompts = {s.prompt_id.split("~s")[0] for s in train}
    quarter, half = subsample(train, 0.25), subsample(train, 0.5)
    kept = {s.prompt_id.split("~s")[0] for s in quarter}
    assert len(kept) == round(0.25 * len(prompts))
    assert len(quarter) == 2 * len(kept)  # each kept prompt's greedy and sampled answers
    assert kept < {s.prompt_id.split("~s")[0] for s in half}
    assert quarter == [s for s in train if s in quarter]
    assert subsample(train, 1.0) == train
    assert subsample(train, 0.25, seed=1) != quarter
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            subsample(train, bad)


def test_batches_respect_the_token_budget_and_cover_every_sequence() -> None:
    seqs = sequences(30, 4, 11)
    groups = batches(seqs, 64, seed=0)
    assert sorted(s.prompt_id for g in groups for s in g) == sorted(s.prompt_id for s in seqs)
    for g in groups:
        longest = max(s.features.shape[0] for s in g)
        assert len(g) == 1 or longest * len(g) <= 64


def test_make_batch_pads_right_and_keeps_the_next_token() -> None:
    seqs = sequences(2, 4, 11)
    b = make_batch(seqs)
    for i, s in enumerate(seqs):
        n = s.features.shape[0]
        assert b.tokens[i, : n + 1].tolist() == s.tokens
        assert int(b.lengths[i]) == n
        assert int(b.answer_from[i]) == s.prompt_len
        torch.testing.assert_close(b.features[i, :n], s.features.float())
