"""Training lowers the loss, raises agreement, and a finished run resumes as a no-op."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from echo_lab.training.testing import HIDDEN, VOCAB, sequences, tiny_head
from echo_lab.training.trainer import TrainConfig, agreement, train


def _cfg() -> TrainConfig:
    return TrainConfig(epochs=4, lr=3e-3, warmup_steps=2, max_batch_tokens=128, checkpoint_every=3)


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    """Two OpenMP threads stall on the shared 2-core machines; one is faster."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_training_learns_a_cyclic_continuation_and_resumes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    head = tiny_head()
    seqs = sequences(40, HIDDEN, VOCAB, seed=1, embed=head.embed)
    before = agreement(head, seqs, depths=2)
    history, seconds = train(head, seqs, seqs, _cfg(), tmp_path / "state.pt")
    assert len(history) == 4
    assert seconds > 0
    assert history[-1].top1[0] > before.top1[0] + 0.2
    weights = {k: v.clone() for k, v in head.state_dict().items()}

    again = tiny_head()
    again.draft_ids.copy_(head.draft_ids)
    again.attach_target(head.embed, head.embed)
    history2, _ = train(again, seqs, seqs, _cfg(), tmp_path / "state.pt")
    assert history2 == history
    for k, v in again.state_dict().items():
        torch.testing.assert_close(v, weights[k])
    with pytest.raises(ValueError, match="other training data"):  # a subset: not this run's
        train(tiny_head(), seqs[:30], seqs, _cfg(), tmp_path / "state.pt")
