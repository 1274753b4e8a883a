"""Draft-head checkpoints round-trip and fail with errors that name the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from echo_server.drafting.eagle_checkpoint import (
    HeadCheckpointError,
    describe_eagle3,
    head_paths,
    load_head,
    save_head,
)
from echo_server.drafting.testing import HIDDEN, VOCAB, tiny_head


def _saved(tmp_path: Path) -> tuple[Path, torch.Tensor]:
    head = tiny_head()
    weights, _ = save_head(head, tmp_path / "head")
    return weights, head.embed


@pytest.mark.parametrize("aux_layers", [(), (0, 5)])
def test_round_trip_keeps_weights_to_float16_precision(
    tmp_path: Path, aux_layers: tuple[int, ...]
) -> None:
    head = tiny_head(aux_layers=aux_layers)
    weights, config = save_head(head, tmp_path / "head.safetensors")
    assert (weights.name, config.name) == ("head.safetensors", "head.json")
    back = load_head(weights, head.embed, head.embed)
    for name, value in head.state_dict().items():
        want = value.half().float() if value.is_floating_point() else value
        torch.testing.assert_close(back.state_dict()[name], want)
    torch.testing.assert_close(back.out_rows, head.out_rows)
    assert back.config == head.config
    assert not back.training


def test_missing_weights_file_is_named(tmp_path: Path) -> None:
    weights, embed = _saved(tmp_path)
    weights.unlink()
    with pytest.raises(HeadCheckpointError, match=r"weights .* do not exist"):
        load_head(weights, embed, embed)


def test_missing_config_is_named(tmp_path: Path) -> None:
    weights, embed = _saved(tmp_path)
    head_paths(weights)[1].unlink()
    with pytest.raises(HeadCheckpointError, match=r"config .* does not exist"):
        load_head(weights, embed, embed)


def test_corrupt_weights_file(tmp_path: Path) -> None:
    weights, embed = _saved(tmp_path)
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(HeadCheckpointError, match="unreadable safetensors"):
        load_head(weights, embed, embed)


def test_config_disagreeing_with_the_weights_reports_the_shape(tmp_path: Path) -> None:
    weights, embed = _saved(tmp_path)
    config = head_paths(weights)[1]
    obj = json.loads(config.read_text())
    obj["intermediate_size"] = 64
    config.write_text(json.dumps(obj))
    with pytest.raises(HeadCheckpointError, match=r"gate_up\.weight has shape"):
        load_head(weights, embed, embed)


def test_wrong_format_string(tmp_path: Path) -> None:
    weights, embed = _saved(tmp_path)
    config = head_paths(weights)[1]
    config.write_text(json.dumps({**json.loads(config.read_text()), "format": "other/9"}))
    with pytest.raises(HeadCheckpointError, match=r"format .other/9."):
        load_head(weights, embed, embed)


def test_target_with_another_vocabulary_is_refused(tmp_path: Path) -> None:
    weights, _ = _saved(tmp_path)
    other = torch.zeros(VOCAB + 7, HIDDEN)
    with pytest.raises(HeadCheckpointError, match="trained for a target embedding"):
        load_head(weights, other, other)


def test_eagle3_directory_is_recognised_with_a_reason(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    reason = describe_eagle3(tmp_path)
    assert reason is not None
    assert "not supported" in reason
    assert describe_eagle3(tmp_path / "nowhere") is None
