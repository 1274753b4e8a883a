"""Which SGLang attention backends can run ECHO's verify pass, and why the others cannot.

ECHO overwrites EAGLE's verify input in place (:mod:`~echo_sglang.step`) with a top-k > 1 tree
in one of SGLang's three mask encodings (:mod:`~echo_sglang.masks`). SGLang 0.5.23 verifies
such trees only on the backends of its ``_PAGE_TREE_SPEC_BACKENDS`` (``_handle_eagle_family`` in
``sglang/srt/arg_groups/speculative_hook.py``): ``triton``, ``flashinfer`` and ``fa3``. Every
other backend either refuses top-k > 1 (``trtllm_mha``), cannot express a per-branch tree
(``flashmla``, ``trtllm_mla``) or was never run with a custom tree mask by ECHO.

A server's backends are ``attention_backend`` and its per-phase overrides
``prefill_attention_backend`` / ``decode_attention_backend`` (SGLang's ``attention_backends_of``:
an unset override falls back to the base). ``None`` everywhere means SGLang chooses one per
GPU at start-up, which may be unsupported, so ECHO asks for an explicit choice.
"""

from __future__ import annotations

from typing import Any

SUPPORTED_ATTENTION_BACKENDS = ("triton", "flashinfer", "fa3")
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
    for field, backend in chosen.items():
        if backend is not None and backend not in SUPPORTED_ATTENTION_BACKENDS:
            flag = "--" + field.replace("_", "-")
            return (
                f"ECHO does not support {flag} {backend}: its verify pass runs top-k > 1 tree "
                f"masks, which SGLang 0.5.23 verifies only on {supported}"
            )
    return None
