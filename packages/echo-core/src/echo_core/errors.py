"""Errors shared by every ECHO package.

All derive from :class:`EchoError` (itself a ``ValueError``), so callers can catch bad input
from any layer at one place while the message names the offending value.
"""

from __future__ import annotations


class EchoError(ValueError):
    """Base class of ECHO's input and contract errors."""


class TreeError(EchoError):
    """A draft tree or super-tree violates a structural invariant."""


class SamplingParamsError(EchoError):
    """Sampling parameters are out of range or inconsistent."""


class AcceptanceError(EchoError):
    """Inputs to an acceptance rule do not fit the tree they refer to."""
