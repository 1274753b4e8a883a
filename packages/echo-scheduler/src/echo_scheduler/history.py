"""Per-request acceptance history: how a request's realised acceptance compares with its keys.

The calibrated acceptance maps (echo_gating.maps) are fitted over every request of the warm-up
data, so they predict the acceptance of a node from its depth and path score alone. Requests
differ beyond that (a request copying code is easier to draft than one writing a poem at the
same drafter confidence), and the drafter's confidence only partly sees it. After each step the
policy knows, per request r, the keys ``u_i`` of the nodes it verified and the accepted length
``A``; since a verified node is accepted iff it lies on the accepted path, ``E[A] = sum_i u_i``
when the maps are calibrated for r. Exponentially weighted (``decay`` = 1 - alpha):

    A_r <- decay A_r + A,   P_r <- decay P_r + sum_i u_i

and the request's factor, shrunk toward 1 by a prior of ``prior`` tokens,

    f_r = (A_r + prior) / (P_r + prior),   clamped to [f_min, f_max]

rescales its keys: ``u'_i = min(1, f_r u_i)``. A per-request constant keeps the key
non-increasing along every path, and the keys stay estimated acceptances, so the cost floor and
the exact cut price rows with them as before. A request seen for the first time has f = 1; a
request absent for more than ``forget_after`` steps is forgotten (it finished or was
preempted; the engine's per-request retry of a failed step is a short absence).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from echo_scheduler.errors import PolicyError

FORGET_AFTER = 64
"""Steps a request may be absent before per-request state forgets it (the engine retries a failed
step one request at a time, so a short absence is not a departure)."""


@dataclass(slots=True)
class Presence:
    """Which requests are still around: each call is one step; a request absent for more than
    ``forget_after`` steps has departed."""

    forget_after: int = FORGET_AFTER
    _seen: dict[int, int] = field(default_factory=dict)  # serial -> the last step it was in
    _clock: int = 0

    def __post_init__(self) -> None:
        if self.forget_after < 0:
            raise PolicyError(f"forget_after must be >= 0 steps, got {self.forget_after}")

    def step(self, ids: list[int]) -> list[int]:
        """Mark ``ids`` present this step; the serials that departed with it."""
        self._clock += 1
        for r in ids:
            self._seen[r] = self._clock
        gone = [r for r, t in self._seen.items() if self._clock - t > self.forget_after]
        for r in gone:
            del self._seen[r]
        return gone


@dataclass(slots=True)
class RequestHistory:
    """The per-request factors of the module docstring, keyed by the engine's request serial."""

    alpha: float = 0.3
    prior: float = 3.0
    f_min: float = 0.25
    f_max: float = 4.0
    forget_after: int = FORGET_AFTER
    _accepted: dict[int, float] = field(default_factory=dict)
    _predicted: dict[int, float] = field(default_factory=dict)
    _presence: Presence = field(init=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise PolicyError(f"history alpha must be in (0, 1], got {self.alpha}")
        if not self.prior > 0.0:
            raise PolicyError(f"history prior must be > 0 tokens, got {self.prior}")
        self._presence = Presence(self.forget_after)
        if not 0.0 < self.f_min <= 1.0 <= self.f_max < float("inf"):
            raise PolicyError(f"need 0 < f_min <= 1 <= f_max < inf, got {self.f_min}, {self.f_max}")

    def factors(self, requests: Tensor) -> Tensor:
        """``f_r`` for each of ``requests`` ([B] int64 serials): [B] float32; forgets the
        requests absent for more than ``forget_after`` calls."""
        ids = [int(r) for r in requests.tolist()]
        for r in self._presence.step(ids):
            self._accepted.pop(r, None)
            self._predicted.pop(r, None)
        f = [
            (self._accepted.get(r, 0.0) + self.prior) / (self._predicted.get(r, 0.0) + self.prior)
            for r in ids
        ]
        out = torch.tensor(f, dtype=torch.float32, device=requests.device)
        return out.clamp(self.f_min, self.f_max)

    def update(self, requests: Tensor, accepted: Tensor, predicted: Tensor) -> None:
        """Fold one verified step in: per request its accepted length ``A`` ([B] int64) and the
        sum of its verified nodes' unscaled keys ``sum_i u_i`` ([B] float)."""
        if not requests.shape == accepted.shape == predicted.shape:
            raise PolicyError(
                f"history update needs matching [B] tensors, got {tuple(requests.shape)}, "
                f"{tuple(accepted.shape)}, {tuple(predicted.shape)}"
            )
        decay = 1.0 - self.alpha
        for r, a, p in zip(requests.tolist(), accepted.tolist(), predicted.tolist(), strict=True):
            self._accepted[r] = decay * self._accepted.get(r, 0.0) + float(a)
            self._predicted[r] = decay * self._predicted.get(r, 0.0) + float(p)

    def __len__(self) -> int:
        return len(self._accepted)
