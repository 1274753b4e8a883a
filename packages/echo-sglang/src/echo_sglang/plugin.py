"""The ``sglang.srt.plugins`` entry point: registers ``ECHO`` and its command-line flags.

SGLang calls :func:`register` (via ``load_plugins()``) early in every process: the launcher
before it parses arguments, then each scheduler and detokenizer process. It

1. registers the speculative algorithm ``ECHO`` (:class:`~echo_sglang.spec_algo.
   EchoSpecAlgo`, worker :class:`~echo_sglang.worker.EchoWorker`), so
   ``--speculative-algorithm ECHO`` resolves;
2. hooks ``ServerArgs.add_cli_args`` to add the ``--speculative-echo-*`` flags
   (:mod:`~echo_sglang.args`), and ``ServerArgs.from_cli_args`` to export them to
   the worker processes, rejecting ECHO flags given without ``--speculative-algorithm ECHO``;
3. registers ECHO's own draft head as the model architecture ``EchoEagleHeadForCausalLM``
   (:mod:`~echo_sglang.models.echo_head`) and hooks Llama's forward so a draft that asks for
   the last layer gets the target's final hidden state (:mod:`~echo_sglang.final_capture`);
4. refuses prompt token ids outside the vocabulary with a 400 instead of letting them crash the
   scheduler (:mod:`~echo_sglang.input_check`).

Everything sglang is imported inside the functions: importing this module needs no sglang.
"""

from __future__ import annotations

import argparse
from typing import Any

from echo_sglang.args import (
    EchoArgs,
    PluginConfigError,
    add_echo_args,
    export_args,
    flags_given,
)

ALGORITHM = "ECHO"
ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"
MODELS_PACKAGE = "echo_sglang.models"

_done: list[str] = []
"""What this process already registered (SGLang's registries are process-global as well)."""


def register() -> None:
    """Entry point (module docstring); safe to call more than once per process."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from echo_sglang.spec_algo import (
        EchoSpecAlgo,
        create_worker_class,
        validate_server_args,
    )

    if get_spec(ALGORITHM) is None:
        SpeculativeAlgorithm.register(
            ALGORITHM,
            supports_overlap=False,
            validate_server_args=validate_server_args,
            spec_class=EchoSpecAlgo,
        )(create_worker_class)
    if "cli" not in _done:
        HookRegistry.register(ADD_CLI_ARGS, add_cli_args_hook, HookType.AFTER)
        HookRegistry.register(FROM_CLI_ARGS, from_cli_args_hook, HookType.AFTER)
        _done.append("cli")
    if "head" not in _done:
        from sglang.srt.models.registry import ModelRegistry

        from echo_sglang.final_capture import TARGET, final_capture_hook

        ModelRegistry.register(MODELS_PACKAGE, overwrite=True)
        HookRegistry.register(TARGET, final_capture_hook, HookType.AFTER)
        _done.append("head")
    if "inputs" not in _done:
        from echo_sglang import input_check

        HookRegistry.register(input_check.TARGET, input_check.input_check_hook, HookType.BEFORE)
        _done.append("inputs")


def add_cli_args_hook(result: Any, parser: argparse.ArgumentParser) -> None:
    """AFTER ``ServerArgs.add_cli_args(parser)``: add ECHO's flags to SGLang's parser."""
    add_echo_args(parser)


def from_cli_args_hook(result: Any, cls: Any, args: argparse.Namespace) -> None:
    """AFTER ``ServerArgs.from_cli_args(args)``: export ECHO's flags when ECHO is selected."""
    algorithm = getattr(args, "speculative_algorithm", None)
    selected = isinstance(algorithm, str) and algorithm.upper() == ALGORITHM
    given = flags_given(args)
    if given and not selected:
        raise PluginConfigError(
            f"{', '.join(given)} only apply with --speculative-algorithm {ALGORITHM}, "
            f"got --speculative-algorithm {algorithm}"
        )
    if selected:
        export_args(EchoArgs.from_namespace(args))
