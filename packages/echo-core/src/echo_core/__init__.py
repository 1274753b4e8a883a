"""echo-core: the shared vocabulary of ECHO (draft trees, layouts, acceptance, step metrics)."""

from echo_core.acceptance import AcceptResult, greedy_accept
from echo_core.acceptance_stochastic import AcceptUniforms, stochastic_accept
from echo_core.errors import AcceptanceError, EchoError, SamplingParamsError, TreeError
from echo_core.sampling import SamplingParams, target_probs
from echo_core.stats import StatsAccumulator, StepStats
from echo_core.tree import (
    ROOT,
    CandidatePool,
    SuperTree,
    TreeBatch,
    empty_tree,
    make_tree,
    select_nodes,
)

__all__ = [
    "ROOT",
    "AcceptResult",
    "AcceptUniforms",
    "AcceptanceError",
    "CandidatePool",
    "EchoError",
    "SamplingParams",
    "SamplingParamsError",
    "StatsAccumulator",
    "StepStats",
    "SuperTree",
    "TreeBatch",
    "TreeError",
    "empty_tree",
    "greedy_accept",
    "make_tree",
    "select_nodes",
    "stochastic_accept",
    "target_probs",
]
__version__ = "0.1.0"
