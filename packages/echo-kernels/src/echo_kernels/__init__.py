"""echo-kernels: ragged super-tree verification kernels (Triton) with torch references.

Public functions dispatch per call (``backend="auto"``: Triton on CUDA, torch on CPU):

- :func:`tree_attention` with :func:`verify_metadata` / :func:`prefill_metadata`;
- :func:`greedy_accept` and :func:`stochastic_accept` (echo-core's rules, same results);
- :func:`commit_kv` (slot-table update after acceptance, no KV copy) and :func:`kept_rows`.

Importing this package never imports triton (only ``echo_kernels.triton_kernels`` does, lazily).
"""

from echo_kernels.acceptance import greedy_accept, stochastic_accept
from echo_kernels.attention_metadata import (
    TreeAttentionMetadata,
    prefill_metadata,
    verify_metadata,
)
from echo_kernels.backend import Backend, BackendError
from echo_kernels.kv_commit import CommitResult, commit_kv, kept_rows
from echo_kernels.tolerances import ATTENTION_TOLERANCES, Tolerance
from echo_kernels.tree_attention import tree_attention

__all__ = [
    "ATTENTION_TOLERANCES",
    "Backend",
    "BackendError",
    "CommitResult",
    "Tolerance",
    "TreeAttentionMetadata",
    "commit_kv",
    "greedy_accept",
    "kept_rows",
    "prefill_metadata",
    "stochastic_accept",
    "tree_attention",
    "verify_metadata",
]
__version__ = "0.1.0"
