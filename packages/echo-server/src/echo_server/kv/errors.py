"""Errors of the KV slot pool."""

from __future__ import annotations

from echo_core.errors import EchoError


class KVCapacityError(EchoError):
    """A request or an allocation does not fit the KV pool; the message gives both sizes."""


class KVStateError(EchoError):
    """Misuse of the pool: double free, unknown request handle, foreign slot."""
