"""Errors of the gRPC layer, each mapped to one status code by the servicers."""

from __future__ import annotations

from echo_core.errors import EchoError


class FieldError(EchoError):
    """A request field is malformed (INVALID_ARGUMENT); ``field`` is its path in the message."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnknownNodeError(EchoError):
    """The controller does not know the node id (NOT_FOUND): the node registers again."""


class StaleRegistrationError(EchoError):
    """A call carries a replaced registration of its node id (FAILED_PRECONDITION)."""


class QueueFullError(EchoError):
    """The node's queue is full (RESOURCE_EXHAUSTED); retry after ``retry_after_ms``."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class ShuttingDownError(EchoError):
    """The node no longer admits requests (UNAVAILABLE)."""


class DuplicateRequestError(EchoError):
    """The request id is already in flight on this node (ALREADY_EXISTS)."""
