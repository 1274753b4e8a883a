"""``echo-sd train-draft`` option handling (no model needed)."""

from __future__ import annotations

import pytest

from echo_lab.cli.train_draft import aux_layers_for, default_aux_layers


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
