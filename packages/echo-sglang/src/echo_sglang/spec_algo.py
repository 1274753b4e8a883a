"""The ``ECHO`` speculative algorithm as SGLang sees it (imports sglang: load lazily).

:class:`EchoSpecAlgo` duck-types SGLang's ``SpeculativeAlgorithm`` members. ECHO drafts with
SGLang's EAGLE worker, so it answers like EAGLE (or EAGLE-3, per
``--speculative-echo-draft-algorithm``) wherever SGLang branches on the algorithm family: draft
model loading, draft KV sizing, hidden-state capture. Methods SGLang calls on builtin members but
``CustomSpecAlgo`` lacks (``need_topk``, ``carries_draft_hidden_states``, ``create_future_map``,
...) are forwarded to the builtin EAGLE/EAGLE3 member.

Start-up (run by SGLang while it resolves server arguments, in the launcher process):
:func:`validate_server_args` checks ECHO's flags against the EAGLE flags and exports them to the
worker processes; :meth:`EchoSpecAlgo.handle_server_args` turns off what ECHO does not support
after SGLang's own EAGLE-family handling (overlap scheduling: the policy decides on the host
between draft and verify).
"""

from __future__ import annotations

import logging
from typing import Any

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from echo_sglang.args import EchoArgs, PluginConfigError, current_args, export_args
from echo_sglang.backends import attention_backend_problem
from echo_sglang.config import EagleShape, EchoConfig, resolve

logger = logging.getLogger(__name__)


class EchoSpecAlgo(CustomSpecAlgo):  # type: ignore[misc]  # sglang ships no type information
    """SGLang's handle on ECHO (module docstring)."""

    def _builtin(self) -> Any:
        return SpeculativeAlgorithm[current_args().draft_algorithm]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._builtin(), name)

    def is_eagle(self) -> bool:
        return True

    def is_eagle3(self) -> bool:
        return bool(current_args().draft_algorithm == "EAGLE3")

    def supports_mixed_chunk(self) -> bool:
        return False

    def supports_grammar_overlap(self) -> bool:
        return False

    def has_draft_kv(self) -> bool:
        return True

    def handle_server_args(self, server_args: Any) -> None:
        """SGLang's own EAGLE-family resolution, then what ECHO adds (module docstring).

        The builtin EAGLE member's dispatcher runs ``_handle_eagle_family`` exactly as for
        ``--speculative-algorithm EAGLE3``: --max-running-requests defaults to 48, mixed chunks
        are turned off (ECHO's ``supports_mixed_chunk`` is False), the page-size / attention
        backend and rejection-sampling checks apply. ECHO then turns overlap scheduling off.
        SGLang hands a custom algorithm a recording stand-in for ``server_args``; the handler's
        own declarations land on the real record with their source, ECHO's writes are recorded.
        """
        self._builtin().handle_server_args(server_args)
        if not server_args.disable_overlap_schedule:
            logger.warning("ECHO runs without overlap scheduling (it selects on the host)")
            server_args.disable_overlap_schedule = True

    def create_worker(self, server_args: Any) -> Any:
        from echo_sglang.pool_capture import install_pool_capture

        install_pool_capture()
        return super().create_worker(server_args)


def config_from_server_args(server_args: Any, args: EchoArgs | None = None) -> EchoConfig:
    """ECHO's configuration from SGLang's (resolving) server arguments and the exported flags."""
    shape = EagleShape(
        num_steps=server_args.speculative_num_steps,
        topk=server_args.speculative_eagle_topk,
        num_draft_tokens=server_args.speculative_num_draft_tokens,
    )
    return resolve(current_args() if args is None else args, shape)


def validate_server_args(server_args: Any) -> None:
    """SGLang's ``validate_server_args`` callback: raise PluginConfigError with the fix."""
    args = current_args()
    unsupported = {
        "speculative_adaptive": "--speculative-adaptive (ECHO sizes trees per step itself)",
        "speculative_use_rejection_sampling": "--speculative-use-rejection-sampling (top-k 1)",
        "enable_multi_layer_eagle": "--enable-multi-layer-eagle",
    }
    for name, flag in unsupported.items():
        if getattr(server_args, name, False):
            raise PluginConfigError(f"ECHO does not support {flag}")
    if getattr(server_args, "pp_size", 1) != 1:
        raise PluginConfigError("ECHO does not support pipeline parallelism (--pp-size > 1) yet")
    backend_problem = attention_backend_problem(server_args)
    if backend_problem is not None:
        raise PluginConfigError(backend_problem)
    if server_args.speculative_draft_model_path is None:
        raise PluginConfigError(
            "ECHO drafts with an EAGLE head: set --speculative-draft-model-path"
        )
    if args.verify == "ragged":
        raise PluginConfigError(
            "--speculative-echo-verify ragged: SGLang 0.5.23 has no ragged target-verify path "
            "for EAGLE-family algorithms, so ECHO builds no ragged layout yet; "
            "serve with --speculative-echo-verify padded"
        )
    config_from_server_args(server_args, args)
    export_args(args)  # the workers read the same flags, defaults included


def create_worker_class(server_args: Any) -> Any:
    """The worker factory registered with SGLang (imports SGLang's EAGLE worker: GPU only)."""
    from echo_sglang.worker import EchoWorker

    return EchoWorker
