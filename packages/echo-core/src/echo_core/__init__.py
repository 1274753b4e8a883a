"""echo-core: the shared vocabulary of ECHO (draft trees, layouts, acceptance, step metrics)."""

from echo_core.errors import AcceptanceError, EchoError, SamplingParamsError, TreeError
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
    "AcceptanceError",
    "CandidatePool",
    "EchoError",
    "SamplingParamsError",
    "SuperTree",
    "TreeBatch",
    "TreeError",
    "empty_tree",
    "make_tree",
    "select_nodes",
]
__version__ = "0.1.0"
