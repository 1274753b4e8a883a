"""Errors raised by echo-gating.

Both derive from :class:`echo_core.errors.EchoError` (a ``ValueError``), so the engine can catch
bad input from any ECHO layer in one place; every message names the offending value.
"""

from __future__ import annotations

from echo_core.errors import EchoError


class GatingError(EchoError):
    """A gating function was called with arguments of the wrong shape, dtype or range."""


class CalibrationError(EchoError):
    """A calibration artefact (record file, gate policy, acceptance map) is invalid or corrupt."""
