"""Errors of the node's generation API, each mapped to one status code by the servicer.

The errors the node shares with the budget controller (:class:`~echo_controller.errors.FieldError`
and the registration errors) live in :mod:`echo_controller.errors`.
"""

from __future__ import annotations

from echo_core.errors import EchoError


class QueueFullError(EchoError):
    """The node's queue is full (RESOURCE_EXHAUSTED); retry after ``retry_after_ms``."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class ShuttingDownError(EchoError):
    """The node no longer admits requests (UNAVAILABLE)."""


class DuplicateRequestError(EchoError):
    """The request id is already in flight on this node (ALREADY_EXISTS)."""
