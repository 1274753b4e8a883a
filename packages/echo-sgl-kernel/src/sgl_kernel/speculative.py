"""``sgl_kernel.speculative``: the module path SGLang imports the NGRAM tree op from.

``sglang/kernels/ops/speculative/reconstruct_tree.py`` runs
``from sgl_kernel.speculative import reconstruct_indices_from_tree_mask`` at import on every
platform but CUDA, HIP and XPU; the CPU-path tree ops are listed here too, as in the compiled
package's module of the same name.
"""

from __future__ import annotations

from sgl_kernel.spec import (
    build_tree_kernel_efficient_cpu,
    reconstruct_indices_from_tree_mask,
    verify_tree_greedy_cpu,
)

__all__ = [
    "build_tree_kernel_efficient_cpu",
    "reconstruct_indices_from_tree_mask",
    "verify_tree_greedy_cpu",
]
