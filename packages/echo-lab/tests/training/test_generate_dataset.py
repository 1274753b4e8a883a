"""Self-distillation on the real embedded target: features, aux features, resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from echo_lab.training.dataset import load_sequences
from echo_lab.training.selfdistill import generate_dataset, stored_aux_layers
from echo_server.model.loader import LoadedModel
from echo_server.prompts import Prompt

PROMPTS = [
    Prompt("t/0", 'def add(a, b):\n    """Return a + b."""\n', False),
    Prompt("t/1", "Name three colours.", True),
]


def test_generation_records_features_aux_layers_and_resumes(
    smollm: LoadedModel, tmp_path: Path
) -> None:
    new = generate_dataset(smollm, PROMPTS[:1], tmp_path, max_tokens=6, aux_layers=(1, 14))
    assert new == 1
    assert generate_dataset(smollm, PROMPTS, tmp_path, max_tokens=6, aux_layers=(1, 14)) == 1
    assert stored_aux_layers(tmp_path) == (1, 14)
    seqs = sorted(load_sequences(tmp_path), key=lambda s: s.prompt_id)
    assert [s.prompt_id for s in seqs] == ["t/0", "t/1"]
    hidden = smollm.model.config.hidden_size
    for s in seqs:
        t = len(s.tokens) - 1
        assert s.features.shape == (t, hidden)
        assert s.aux is not None
        assert s.aux.shape == (t, 2 * hidden)
        # greedy: the target's feature at row t picks token t+1 for every generated token
        logits = smollm.model.logits(s.features[s.prompt_len - 1 :].float())
        assert logits.argmax(-1).tolist() == s.tokens[s.prompt_len :]
    with pytest.raises(ValueError, match="aux layers"):
        generate_dataset(smollm, PROMPTS, tmp_path, max_tokens=6)


def test_sampled_continuations_are_seeded_resumable_and_follow_the_prompt(
    smollm: LoadedModel, tmp_path: Path
) -> None:
    """Each prompt's greedy answer plus ``samples`` sampled ones (``<id>~s<k>``), seeded: a
    second directory generated the same way holds the same tokens, and a rerun adds nothing."""
    runs = []
    for out in (tmp_path / "a", tmp_path / "b"):
        assert generate_dataset(smollm, PROMPTS, out, max_tokens=8, samples=2) == 6
        assert generate_dataset(smollm, PROMPTS, out, max_tokens=8, samples=2) == 0
        runs.append({s.prompt_id: s.tokens for s in load_sequences(out)})
    a, b = runs
    assert sorted(a) == ["t/0", "t/0~s1", "t/0~s2", "t/1", "t/1~s1", "t/1~s2"]
    assert a == b
    for pid in ("t/0", "t/1"):  # every continuation starts from the same prompt tokens
        n = next(s.prompt_len for s in load_sequences(tmp_path / "a") if s.prompt_id == pid)
        assert {tuple(a[f"{pid}~s{k}"][:n]) for k in (1, 2)} == {tuple(a[pid][:n])}
    with pytest.raises(ValueError, match="temperature"):
        generate_dataset(smollm, PROMPTS, tmp_path / "c", samples=1, temperature=0.0)
