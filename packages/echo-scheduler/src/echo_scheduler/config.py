"""Policy configuration, with the paper's two operating points as presets.

Sizes follow the EAGLE/SGLang convention: ``num_draft_tokens`` N counts the root (the verified
last token that yields the bonus token), so a request's fixed tree has ``N - 1`` draft nodes, and
only draft nodes count against the budget K. Paper defaults:

- high concurrency (:meth:`PolicyConfig.high_concurrency`, the default): depth 3, top-k 3, N = 5;
- low concurrency (:meth:`PolicyConfig.low_concurrency`): depth 8, top-k 10, N = 60.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from echo_scheduler.errors import PolicyError


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Shape parameters shared by all policies (each uses the ones it needs)."""

    base_depth: int = 3  # D0: depth of EAGLE-2 trees, and ECHO's base depth
    topk: int = 3  # k0: frontier nodes expanded per request per depth (EAGLE-2 top-k)
    num_draft_tokens: int = 5  # N incl. the root: N - 1 draft nodes per fixed-size tree
    max_depth: int = 8  # Dmax: deepest depth ECHO and global top-K draft
    max_width: int = 6  # Wmax: children drafted per expanded node by ECHO/global top-K
    chain_length: int = 4  # k of the chain baseline
    static_branching: tuple[int, ...] = field(default=(2, 1))  # children per node, per depth
    min_depth_gain: float = 0.0  # ECHO drafts one more depth only if it promises this many tokens

    def __post_init__(self) -> None:
        for name in ("base_depth", "topk", "max_depth", "max_width", "chain_length"):
            if getattr(self, name) < 1:
                raise PolicyError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_draft_tokens < 1:
            raise PolicyError(f"num_draft_tokens must be >= 1, got {self.num_draft_tokens}")
        if self.base_depth > self.max_depth:
            raise PolicyError(f"base_depth {self.base_depth} must be <= max_depth {self.max_depth}")
        if not self.min_depth_gain >= 0.0:
            raise PolicyError(f"min_depth_gain must be >= 0, got {self.min_depth_gain}")
        if not self.static_branching or min(self.static_branching) < 1:
            raise PolicyError(
                f"static_branching must be non-empty, all >= 1, got {self.static_branching}"
            )

    @property
    def tree_nodes(self) -> int:
        """Draft nodes of a fixed-size per-request tree: ``N - 1``."""
        return self.num_draft_tokens - 1

    @property
    def draft_width(self) -> int:
        """Children drafted per expanded node by the width-aware policies: ``max(k0, Wmax)``."""
        return max(self.topk, self.max_width)

    @staticmethod
    def high_concurrency() -> PolicyConfig:
        """Paper, high load (SGLang, batch 256): depth 3, top-k 3, 5 tokens per request."""
        return PolicyConfig()

    @staticmethod
    def low_concurrency() -> PolicyConfig:
        """Paper, low load (batch 1, EAGLE-3 setting): depth 8, top-k 10, 60 tokens."""
        return PolicyConfig(
            base_depth=8,
            topk=10,
            num_draft_tokens=60,
            max_depth=10,
            max_width=10,
            chain_length=8,
            static_branching=(4, 3, 2, 1, 1, 1, 1, 1),
        )
