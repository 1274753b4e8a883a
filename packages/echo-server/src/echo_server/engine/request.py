"""A generation request's input, its validation, and its state while the engine runs it.

Lifecycle: ``WAITING`` (queued) -> ``PREFILLING`` (admitted: has KV, its prompt is being cached,
in chunks when the engine limits prefill rows per step) -> ``RUNNING`` (prefilled; has a root
token) -> ``FINISHED`` (EOS, max_tokens, a stop string, cancelled, or failed validation). The
root is the last emitted token, whose K/V is not cached yet: the next verify pass computes it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from echo_core.errors import EchoError
from echo_core.sampling import SamplingParams
from echo_core.stats import AcceptanceTotals
from echo_server.kv.pool import RequestHandle
from echo_server.model.tokenizer import IncrementalDetokenizer


class RequestError(EchoError):
    """A request that can never be served as asked (the message says why)."""


class FinishReason(enum.Enum):
    EOS = "eos"
    LENGTH = "length"
    STOP = "stop"
    CANCELLED = "cancelled"
    ERROR = "error"


class Phase(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What a client asks for: a prompt (text or token ids) and sampling parameters."""

    request_id: str
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    chat: bool = True  # wrap a text prompt in the model's chat template
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))

    def __post_init__(self) -> None:
        if not self.request_id:
            raise RequestError("request_id must be a non-empty string")
        if (self.prompt is None) == (self.prompt_ids is None):
            raise RequestError(f"{self.request_id}: give exactly one of prompt and prompt_ids")
        if self.prompt is not None and not self.prompt.strip():
            raise RequestError(f"{self.request_id}: the prompt is empty")
        if self.prompt_ids is not None and len(self.prompt_ids) == 0:
            raise RequestError(f"{self.request_id}: prompt_ids is empty")


@dataclass(frozen=True, slots=True)
class StepEvent:
    """What one engine step produced for one request (streamed to clients)."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None = None
    error: str | None = None


@dataclass(slots=True)
class RequestState:
    """Engine-side state of one request (mutable; owned by the engine loop)."""

    request: GenerationRequest
    prompt_ids: list[int]
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator
    serial: int = -1  # engine-wide number, unique per engine and never reused (warm-up records)
    phase: Phase = Phase.WAITING
    kv: RequestHandle | None = None
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    steps: int = 0
    accepted: int = 0  # draft tokens accepted over all steps
    verified: int = 0  # draft tokens verified over all steps
    first_token_s: float | None = None
    submitted_s: float = 0.0
    finished_s: float | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def context(self) -> list[int]:
        """Every committed token: prompt then output (the root is the last one)."""
        return self.prompt_ids + self.output_ids

    @property
    def remaining(self) -> int:
        """Tokens still allowed by max_tokens."""
        return self.params.max_tokens - len(self.output_ids)

    @property
    def root(self) -> int:
        return self.output_ids[-1]

    def record_step(self, accepted: int, verified: int) -> None:
        """Count one decode step that verified ``verified`` draft nodes and accepted
        ``accepted``."""
        self.steps += 1
        self.accepted += accepted
        self.verified += verified

    @property
    def acceptance(self) -> AcceptanceTotals:
        """This request's counts over its decode steps (one request-step each)."""
        return AcceptanceTotals(self.steps, self.verified, self.accepted)

    @property
    def mean_accepted_length(self) -> float:
        """:attr:`AcceptanceTotals.mean_accepted_length` of this request; 1.0 is plain decoding."""
        return self.acceptance.mean_accepted_length

    @property
    def draft_yield(self) -> float:
        """:attr:`AcceptanceTotals.draft_yield` of this request."""
        return self.acceptance.draft_yield


def find_stop(text: str, stops: tuple[str, ...], search_from: int) -> int | None:
    """Index in ``text`` where the earliest stop string starts, searching new text only.

    ``search_from`` is where the previous check ended; a stop string may straddle the boundary,
    so the search starts ``max(len(stop)) - 1`` characters earlier.
    """
    if not stops:
        return None
    start = max(0, search_from - max(len(s) for s in stops) + 1)
    hits = [i for s in stops if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None
