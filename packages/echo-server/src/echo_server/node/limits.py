"""What a node accepts of a generation request, beyond the engine's own checks (every transport
validates against the same :class:`RequestLimits`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What a node accepts, beyond the engine's own checks."""

    vocab_size: int
    policy: str  # the node's policy: the only name GenerateRequest.policy may carry
    default_max_tokens: int = 128
    max_tokens: int = 4096
    max_prompt_chars: int = 65536
    max_prompt_tokens: int = 16384
    max_request_id_chars: int = 128
    max_stop_strings: int = 16
    max_stop_chars: int = 256
