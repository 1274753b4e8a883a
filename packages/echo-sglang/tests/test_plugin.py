"""The plugin inside SGLang's own registry, hooks and ServerArgs (needs SGLang's source)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from echo_sglang.args import ENV_VAR, EchoArgs, PluginConfigError, current_args
from echo_sglang.plugin import ALGORITHM, register

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@pytest.fixture
def registered(sglang_site: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``register()`` run as SGLang's ``load_plugins`` would; the environment restored after."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    register()
    register()  # a second load in the same process changes nothing
    hooks = importlib.import_module("sglang.srt.plugins.hook_registry")
    hooks.HookRegistry.apply_hooks()
    return importlib.import_module("sglang.srt.speculative.spec_info").SpeculativeAlgorithm


def test_entry_point_names_the_register_function() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with PYPROJECT.open("rb") as f:
        project = tomllib.load(f)["project"]
    target = project["entry-points"]["sglang.srt.plugins"]["echo"]
    module, attr = target.split(":")
    assert getattr(importlib.import_module(module), attr) is register
    assert project["optional-dependencies"]["sglang"] == ["sglang==0.5.23"]


def test_echo_registers_and_resolves_as_an_eagle_family_algorithm(
    registered: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    algo = registered.from_string("echo")
    assert algo.name == ALGORITHM
    assert algo.is_speculative()
    assert algo.is_eagle()
    assert not algo.is_ngram()
    assert algo.is_eagle3()  # default draft head
    monkeypatch.setenv(ENV_VAR, EchoArgs(draft_algorithm="EAGLE").to_json())
    assert not algo.is_eagle3()
    # Methods only builtin members have are answered by the EAGLE member.
    assert algo.need_topk()
    assert algo.carries_draft_hidden_states()
    assert not algo.supports_mixed_chunk()
    assert algo.supports_overlap is False
    with pytest.raises(ValueError, match="reserved"):
        registered.register("EAGLE")(lambda server_args: None)


BASE_ARGV = {
    "--model-path": "/models/target",
    "--speculative-algorithm": "ECHO",
    "--speculative-draft-model-path": "/models/eagle3-head",
    "--speculative-num-steps": "3",
    "--speculative-eagle-topk": "4",
    "--speculative-num-draft-tokens": "9",
    "--attention-backend": "triton",
    "--page-size": "1",
}
"""A valid ECHO launch; tests drop or replace flags of it."""


def _real_server_args(*extra: str, drop: tuple[str, ...] = ()) -> Any:
    """SGLang's own ``ServerArgs`` from its own parser (hooks applied: ECHO's flags exported).

    ``extra`` flags are appended (a repeated flag replaces the base value: argparse keeps the
    last); ``drop`` removes base flags, as a user who never typed them.
    """
    server_args_cls = importlib.import_module("sglang.srt.server_args").ServerArgs
    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    server_args_cls.add_cli_args(parser)
    argv = [x for flag, value in BASE_ARGV.items() if flag not in drop for x in (flag, value)]
    return server_args_cls.from_cli_args(parser.parse_args([*argv, *extra]))


def test_validation_rejects_what_echo_cannot_serve(registered: Any) -> None:
    algo = registered.from_string(ALGORITHM)
    algo.validate_server_args(_real_server_args())
    assert current_args() == EchoArgs()  # exported for the workers, defaults included
    cases = [
        (_real_server_args("--speculative-eagle-topk", "1"), "topk >= 2"),
        (_real_server_args(drop=("--speculative-num-steps",)), "set explicitly"),
        (
            _real_server_args(drop=("--speculative-draft-model-path",)),
            "--speculative-draft-model-path",
        ),
        (_real_server_args("--speculative-adaptive"), "--speculative-adaptive"),
        (_real_server_args("--speculative-use-rejection-sampling"), "rejection-sampling"),
        (_real_server_args("--enable-multi-layer-eagle"), "--enable-multi-layer-eagle"),
        (_real_server_args("--pp-size", "2"), "pipeline parallelism"),
    ]
    for server_args, message in cases:
        with pytest.raises(PluginConfigError, match=message):
            algo.validate_server_args(server_args)


def test_ragged_serving_is_refused_with_the_reason(registered: Any) -> None:
    server_args = _real_server_args("--speculative-echo-verify", "ragged")
    assert current_args().verify == "ragged"  # the launcher exported it
    with pytest.raises(PluginConfigError, match="no ragged target-verify path"):
        registered.from_string(ALGORITHM).validate_server_args(server_args)


def test_sglang_eagle_family_handling_runs_for_echo(
    registered: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ECHO's handler runs SGLang's ``_handle_eagle_family`` through SGLang's own plugin call
    (``record_foreign_defaults``, as ``handle_speculative_decoding`` makes it) on a real record.

    Two of its helpers read the target checkpoint's HF config (``model_config_of``, and the
    IQuest-Q1 MTP probe through it), whose import chain needs torchvision and processor stacks
    that SGLang's CPU-less source mount lacks; they are replaced by a Llama architecture answer.
    Everything else in the handler is SGLang's code as shipped.
    """
    hook = importlib.import_module("sglang.srt.arg_groups.speculative_hook")
    overrides = importlib.import_module("sglang.srt.arg_groups.overrides")
    llama = SimpleNamespace(hf_config=SimpleNamespace(architectures=["LlamaForCausalLM"]))
    monkeypatch.setattr(hook, "model_config_of", lambda server_args: llama)
    monkeypatch.setattr(hook, "_handle_iquest_q1_mtp_draft", lambda server_args: False)
    algo = registered.from_string(ALGORITHM)

    def resolve(server_args: Any) -> dict[str, Any]:
        overrides.declare_resolution(server_args, "test", speculative_algorithm=ALGORITHM)
        overrides.record_foreign_defaults(server_args, "custom_validate", algo.validate_server_args)
        overrides.record_foreign_defaults(server_args, "custom_algo", algo.handle_server_args)
        fields = ("max_running_requests", "enable_mixed_chunk", "disable_overlap_schedule")
        return {f: overrides.resolution_result(server_args, f) for f in fields}

    server_args = _real_server_args("--enable-mixed-chunk")
    assert resolve(server_args) == {
        "max_running_requests": 48,
        "enable_mixed_chunk": False,
        "disable_overlap_schedule": True,
    }
    sources = [source for source, _ in server_args._resolved_overrides]
    assert sources.count("_handle_eagle_family") == 2  # SGLang's handler made two decisions
    assert resolve(_real_server_args("--max-running-requests", "7"))["max_running_requests"] == 7
    # SGLang's page-size check for tree drafts (page_size > 1) passes ECHO's backends.
    assert resolve(_real_server_args("--page-size", "16"))["disable_overlap_schedule"] is True


def test_sglang_parser_takes_the_echo_flags(registered: Any) -> None:
    server_args_cls = importlib.import_module("sglang.srt.server_args").ServerArgs
    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    server_args_cls.add_cli_args(parser)
    argv = ["--model-path", "/models/target", "--speculative-algorithm", "ECHO"]
    ns = parser.parse_args(
        [*argv, "--speculative-echo-budget", "64", "--speculative-echo-max-depth", "3"]
    )
    server_args_cls.from_cli_args(ns)
    assert current_args() == EchoArgs(budget=64, max_depth=3)
    with pytest.raises(argparse.ArgumentError, match="must be an integer >= 1, got '0'"):
        parser.parse_args([*argv, "--speculative-echo-max-width", "0"])
    eagle = parser.parse_args(["--model-path", "m", "--speculative-algorithm", "EAGLE3",
                               "--speculative-echo-verify", "ragged"])  # fmt: skip
    with pytest.raises(PluginConfigError, match="only apply with --speculative-algorithm ECHO"):
        server_args_cls.from_cli_args(eagle)


@pytest.mark.parametrize("backend", ["triton", "flashinfer", "fa3", "intel_amx"])
def test_supported_attention_backends_pass_validation(registered: Any, backend: str) -> None:
    server_args = _real_server_args("--attention-backend", backend)
    registered.from_string(ALGORITHM).validate_server_args(server_args)
    assert current_args() == EchoArgs()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ((), "needs --attention-backend set explicitly"),
        (("--attention-backend", "trtllm_mha"), "--attention-backend trtllm_mha"),
        (("--attention-backend", "torch_native"), "only on triton, flashinfer, fa3, intel_amx"),
        (("--attention-backend", "intel_amx", "--page-size", "16"), "needs --page-size 1"),
        (
            ("--attention-backend", "triton", "--decode-attention-backend", "flashmla"),
            "--decode-attention-backend flashmla",
        ),
    ],
)
def test_unsupported_attention_backends_are_refused_with_the_reason(
    registered: Any, flags: tuple[str, ...], message: str
) -> None:
    server_args = _real_server_args(*flags, drop=("--attention-backend",))
    with pytest.raises(PluginConfigError, match=message):
        registered.from_string(ALGORITHM).validate_server_args(server_args)
