"""The feature recorder and the shard format."""

from __future__ import annotations

from pathlib import Path

import torch

from echo_server.training.selfdistill import (
    FeatureRecorder,
    done_prompt_ids,
    read_shard,
    write_shard,
)
from echo_server.training.synthetic import feedback, sequences


def test_recorder_joins_prefill_and_steps_and_appends_the_last_token() -> None:
    rec = FeatureRecorder()
    f = torch.randn(5, 8)
    rec.observe(feedback([("a", [1, 2, 3], f[:3], 0, 4), ("b", [7], f[3:4], 0, 8)]))
    rec.observe(feedback([("a", [4], f[4:5], 3, 5)]))
    rec.release("a")
    tokens, feats = rec.finished["a"]
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
