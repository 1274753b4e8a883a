"""``echo-sd train-draft`` option handling (no model needed)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from echo_lab.cli.train_draft import (
    add_parser,
    aux_layers_for,
    default_aux_layers,
    interleave,
    run,
)
from echo_server.prompts import Prompt


def test_default_aux_layers_are_low_middle_high() -> None:
    assert default_aux_layers(30) == (1, 14, 26)  # SmolLM2-135M
    assert default_aux_layers(32) == (1, 15, 28)  # Llama-3.1-8B, EAGLE-3's choice
    assert default_aux_layers(2) == (0, 1)  # shallow targets: fewer, still in range


def test_aux_layers_option() -> None:
    assert aux_layers_for(None, 30) == (1, 14, 26)
    assert aux_layers_for([], 30) == ()
    assert aux_layers_for([7, 3, 7], 30) == (3, 7)
    with pytest.raises(ValueError, match="outside"):
        aux_layers_for([30], 30)


def test_a_bad_train_fraction_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["train-draft", "--work-dir", str(tmp_path / "w"), "--train-fraction", "0"]
    )
    assert run(args) == 2
    assert "fraction must lie in (0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()  # nothing loaded, nothing written


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["train-draft", *argv])


def test_the_archive_stage_needs_a_path_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(_args("--stage", "archive", "--work-dir", str(tmp_path / "w"))) == 2
    assert "--stage archive needs --archive" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_a_fresh_work_dir_restores_the_archive_instead_of_decoding(tmp_path: Path) -> None:
    """Generate two prompts' answers with --archive; a second work dir given the same archive
    rebuilds both by teacher forcing and decodes nothing (its generation writes no new shard
    beyond the restored ones), and the archive then holds the same sequences."""
    from echo_lab.training.archive import read_archive
    from echo_lab.training.dataset import load_sequences

    archive = tmp_path / "tokens.safetensors.gz"
    common = ("--stage", "generate", "--prompts", "2", "--max-tokens", "4", "--aux-layers")
    assert run(_args(*common, "--work-dir", str(tmp_path / "a"), "--archive", str(archive))) == 0
    first = read_archive(archive).sequences
    assert len(first) == 2
    assert run(_args(*common, "--work-dir", str(tmp_path / "b"), "--archive", str(archive))) == 0
    assert read_archive(archive).sequences == first
    restored = load_sequences(tmp_path / "b" / "data")
    assert sorted((s.prompt_id, s.tokens) for s in restored) == sorted(
        (s.sequence_id, list(s.tokens)) for s in first
    )
    assert len(list((tmp_path / "b" / "data").glob("shard_*.safetensors"))) == 1


def test_built_and_chat_prompts_are_interleaved_in_proportion() -> None:
    built = [Prompt(f"b/{i}", "x", False) for i in range(6)]
    chat = [Prompt(f"c/{i}", "y", True) for i in range(3)]
    ids = [p.prompt_id for p in interleave(built, chat)]
    assert ids == ["b/0", "c/0", "b/1", "b/2", "c/1", "b/3", "b/4", "c/2", "b/5"]
    assert interleave(built, []) == built
    assert interleave([], chat) == chat
