"""Errors of the model runner."""

from __future__ import annotations

from echo_core.errors import EchoError


class ModelLoadError(EchoError):
    """A checkpoint, its config or its tokenizer cannot be loaded; the message names what."""
