"""Engine knobs (:class:`EngineConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from echo_scheduler.driver import MAX_DRAFT_DEPTH
from echo_server.engine.chunking import DEFAULT_PREFILL_CHUNK
from echo_server.engine.profile import DEFAULT_CACHE


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine knobs. ``budget`` is K, draft tokens verified per step over the whole batch, or
    ``"auto"``: K_max from the verify-cost profile measured on this machine
    (engine/budget.py, engine/profile.py).
    ``prefill_chunk`` is the most prompt rows prefilled per step over all requests (chunked
    prefill, engine/chunking.py), or None: every admitted prompt whole, in the step admitting it.
    ``profile_cache`` is the directory the checked verify profile is cached in
    (engine/profile_store.py), or None: measure it at every start and never cache it.
    """

    budget: int | Literal["auto"] = 16
    max_batch: int = 8
    kv_slots: int = 16384
    max_context: int | None = None
    max_depth: int = MAX_DRAFT_DEPTH  # safety bound on drafted depths per step
    elastic: bool = False  # per-step cost floor (echo_scheduler.elastic), from the verify profile
    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK  # prompt rows per step; None: no limit
    policy_on_host: bool = True  # the policy ranks CPU copies of the pool (see the engine)
    profile_cache: Path | None = DEFAULT_CACHE  # verify-profile cache directory; None: no cache

    def __post_init__(self) -> None:
        if self.budget != "auto" and (not isinstance(self.budget, int) or self.budget < 0):
            raise ValueError(f"budget must be an int >= 0 or 'auto', got {self.budget!r}")
        if self.max_batch < 1 or self.kv_slots < 1 or self.max_depth < 0:
            raise ValueError(
                f"need max_batch >= 1, kv_slots >= 1, max_depth >= 0, got {self.max_batch}, "
                f"{self.kv_slots}, {self.max_depth}"
            )
        if self.prefill_chunk is not None and (
            not isinstance(self.prefill_chunk, int) or self.prefill_chunk < 1
        ):
            raise ValueError(
                f"prefill_chunk must be an int >= 1 or None, got {self.prefill_chunk!r}"
            )
