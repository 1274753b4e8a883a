"""The drafter of plain decoding: it proposes nothing and reads nothing.

Plain decoding is the reference every speedup is divided by, so it must not pay for a drafter it
never uses: an EAGLE head attached to a plain engine would still run over every committed row in
``observe`` (about 2-3 ms of a 30 ms step at batch 1 on the dev CPU).
"""

from __future__ import annotations

from collections.abc import Sequence

from echo_server.drafting.base import ExpandRequest, Proposals, TargetFeedback


class NullDrafter:
    """A :class:`~echo_server.drafting.base.Drafter` with no proposals and no state."""

    name = "none"
    aux_layers: tuple[int, ...] = ()

    def observe(self, feedback: TargetFeedback) -> None:
        """Nothing to learn from committed rows."""

    def begin_step(self, contexts: Sequence[Sequence[int]], request_ids: Sequence[str]) -> None:
        """Nothing to prepare."""

    def expand(self, nodes: ExpandRequest) -> Proposals:
        """No children for any node."""
        return Proposals.empty()

    def release(self, request_id: str) -> None:
        """No per-request state."""
