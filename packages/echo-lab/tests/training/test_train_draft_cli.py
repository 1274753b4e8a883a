"""``echo-sd train-draft`` option handling (no model needed)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from echo_lab.cli.train_draft import add_parser, aux_layers_for, default_aux_layers, run


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
