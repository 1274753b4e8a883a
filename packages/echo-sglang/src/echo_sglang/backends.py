"""Which SGLang attention backends can run ECHO's verify pass, and why the others cannot.

ECHO overwrites EAGLE's verify input in place (:mod:`~echo_sglang.step`) with a top-k > 1 tree
in one of SGLang's three mask encodings (:mod:`~echo_sglang.masks`). SGLang 0.5.23's own rule
for such trees (``_handle_eagle_family`` in ``sglang/srt/arg_groups/speculative_hook.py`` and
the draft backend factory in ``sglang/srt/speculative/draft_utils.py``): the backend must have
an EAGLE multi-step draft backend, and with ``--page-size > 1`` it must be one of
``_PAGE_TREE_SPEC_BACKENDS`` (``triton``, ``flashinfer``, ``fa3``). ECHO accepts those three
(GPU) and ``intel_amx`` (SGLang's CPU kernels; ``--page-size 1`` only, as SGLang requires),
the backends it was run on. Every other backend either refuses top-k > 1 (``trtllm_mha``),
cannot express a per-branch tree (``flashmla``, ``trtllm_mla``), has no EAGLE draft backend
(``torch_native``) or was never run with a custom tree mask by ECHO.

A server's backends are ``attention_backend`` and its per-phase overrides
``prefill_attention_backend`` / ``decode_attention_backend`` (SGLang's ``attention_backends_of``:
an unset override falls back to the base). ``None`` everywhere means SGLang chooses one per
machine at start-up, which may be unsupported, so ECHO asks for an explicit choice.
"""

from __future__ import annotations

from typing import Any

PAGED_TREE_BACKENDS = ("triton", "flashinfer", "fa3")
SUPPORTED_ATTENTION_BACKENDS = (*PAGED_TREE_BACKENDS, "intel_amx")
BACKEND_FIELDS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")


def attention_backend_problem(server_args: Any) -> str | None:
    """Why ECHO cannot serve with ``server_args``' attention backends, or None when it can."""
    chosen = {f: getattr(server_args, f, None) for f in BACKEND_FIELDS}
    supported = ", ".join(SUPPORTED_ATTENTION_BACKENDS)
    if chosen["attention_backend"] is None and None in (
        chosen["prefill_attention_backend"], chosen["decode_attention_backend"]
    ):  # fmt: skip
        return (
            f"ECHO needs --attention-backend set explicitly to one of {supported} (SGLang's "
            "automatic choice may be a backend that cannot verify ECHO's trees)"
        )
    page_size = getattr(server_args, "page_size", None) or 1
    for field, backend in chosen.items():
        if backend is None:
            continue
        flag = "--" + field.replace("_", "-")
        if backend not in SUPPORTED_ATTENTION_BACKENDS:
            return (
                f"ECHO does not support {flag} {backend}: its verify pass runs top-k > 1 tree "
                f"masks, which SGLang 0.5.23 verifies only on {supported}"
            )
        if page_size > 1 and backend not in PAGED_TREE_BACKENDS:
            return (
                f"ECHO with {flag} {backend} needs --page-size 1 (got {page_size}): SGLang "
                f"0.5.23 runs top-k > 1 trees with pages only on {', '.join(PAGED_TREE_BACKENDS)}"
            )
    return None
