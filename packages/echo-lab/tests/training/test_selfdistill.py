"""The feature recorder and the shard format."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from echo_lab.training.selfdistill import (
    DistilledSequence,
    FeatureRecorder,
    done_prompt_ids,
    read_shard,
    stored_aux_layers,
    write_shard,
)
from echo_lab.training.testing import feedback, sequences


def test_recorder_joins_prefill_and_steps_and_appends_the_last_token() -> None:
    rec = FeatureRecorder()
    f = torch.randn(5, 8)
    rec.observe(feedback([("a", [1, 2, 3], f[:3], 0, 4), ("b", [7], f[3:4], 0, 8)]))
    rec.observe(feedback([("a", [4], f[4:5], 3, 5)]))
    rec.release("a")
    tokens, feats, aux = rec.finished["a"]
    assert aux is None
    assert tokens == [1, 2, 3, 4, 5]
    torch.testing.assert_close(feats.float(), torch.cat([f[:3], f[4:5]]).half().float())
    assert "b" not in rec.finished


def test_shards_round_trip_and_list_done_prompts(tmp_path: Path) -> None:
    seqs = sequences(5, 8, 30)
    write_shard(tmp_path / "shard_00000.safetensors", seqs[:3])
    write_shard(tmp_path / "shard_00001.safetensors", seqs[3:])
    back = read_shard(tmp_path / "shard_00000.safetensors") + read_shard(
        tmp_path / "shard_00001.safetensors"
    )
    for a, b in zip(seqs, back, strict=True):
        assert (a.prompt_id, a.tokens, a.prompt_len) == (b.prompt_id, b.tokens, b.prompt_len)
        assert torch.equal(a.features, b.features)
    assert done_prompt_ids(tmp_path) == {s.prompt_id for s in seqs}


def test_recorder_keeps_aux_layers_and_shards_round_trip_them(tmp_path: Path) -> None:
    rec = FeatureRecorder(aux_layers=(0, 2))
    f, a0, a2 = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)
    rec.observe(feedback([("a", [1, 2, 3], f[:3], 0, 4)], (a0[:3], a2[:3])))
    rec.observe(feedback([("a", [4], f[3:], 3, 5)], (a0[3:], a2[3:])))
    rec.release("a")
    tokens, feats, aux = rec.finished["a"]
    assert aux is not None
    torch.testing.assert_close(aux.float(), torch.cat([a0, a2], dim=-1).half().float())
    seq = DistilledSequence("a", tokens, feats, 3, aux)
    write_shard(tmp_path / "shard_00000.safetensors", [seq], (0, 2))
    (back,) = read_shard(tmp_path / "shard_00000.safetensors")
    assert back.aux is not None
    assert torch.equal(back.aux, aux)
    assert stored_aux_layers(tmp_path) == (0, 2)


def test_shards_with_different_aux_layers_are_refused(tmp_path: Path) -> None:
    seqs = sequences(2, 8, 30)
    write_shard(tmp_path / "shard_00000.safetensors", seqs[:1])
    with_aux = [
        DistilledSequence(s.prompt_id, s.tokens, s.features, s.prompt_len, s.features)
        for s in seqs[1:]
    ]
    write_shard(tmp_path / "shard_00001.safetensors", with_aux, (3,))
    with pytest.raises(ValueError, match="different aux layers"):
        stored_aux_layers(tmp_path)
