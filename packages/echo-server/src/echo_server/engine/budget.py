"""The engine's budget chain: echo-scheduler's :class:`~echo_scheduler.budget.BudgetChain` built
from the engine's knobs and the verify profile measured on this machine.

``budget`` an int: a fixed K; ``"auto"``: the knee of the hinge fitted to the profile,

    K(B) = clamp(K_max(B), 0, 256),  K_max(B) = max(0, floor(T0) - B)

i.e. fill the verify pass up to the knee where extra tokens start to cost. With ``elastic`` the
chain also prices rows with the elastic floor over the same profile. The profile itself (timing,
checks, cache) is :mod:`echo_server.engine.profile`'s and :mod:`echo_server.engine.profile_store`'s.
"""

from __future__ import annotations

from pathlib import Path

from echo_scheduler.budget import BudgetChain, LocalBudget
from echo_scheduler.cost import VerifyCostModel
from echo_scheduler.elastic import ElasticFloor
from echo_server.engine import profile_store
from echo_server.engine.profile import DEFAULT_CACHE
from echo_server.model.llama import LlamaModel

__all__ = ["FLOOR_SLOPE_ROWS", "engine_budget"]

FLOOR_SLOPE_ROWS = 6.0
"""The elastic floor's least slope window in rows (``ElasticFloor(slope_rows=...)``): the width of
that staircase's steps on the EPYC, so the floor's slope past the recent row count is a step's
cost per row, never 0 or a whole step. With these points (and 128, timed in 7 rounds) it lifted
ECHO at c = 4 from 1.044 to 1.088 of plain decoding on HumanEval and from 0.985 to 1.018 on
MT-Bench (lockstep, the bench's ``echo-stairs`` arm; docs/lab/2026-12-04.md). A GPU's
profile is flat below its knee, so the window changes nothing there but the few rows around
the knee."""


def engine_budget(
    budget: int | str, elastic: bool, model: LlamaModel, cache_dir: Path | None = DEFAULT_CACHE
) -> BudgetChain:
    """The chain for ``budget`` (an int K, or ``"auto"``: K_max of the verify profile) and, with
    ``elastic``, the elastic floor over that profile (checked, and cached in ``cache_dir`` only
    when consistent: :mod:`echo_server.engine.profile_store`)."""
    needs_profile = elastic or not isinstance(budget, int)
    checked = profile_store.checked_profile(model, cache_dir) if needs_profile else None
    profile = checked.profile if checked is not None else None
    if isinstance(budget, int):
        local = LocalBudget(fixed=budget)
    else:
        assert profile is not None
        local = LocalBudget(cost=VerifyCostModel.fit(list(profile.tokens), list(profile.seconds)))
    floor = (
        ElasticFloor(profile, slope_rows=FLOOR_SLOPE_ROWS)
        if elastic and profile is not None
        else None
    )
    return BudgetChain(local, floor)
