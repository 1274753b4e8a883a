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


def _server_args(**overrides: Any) -> SimpleNamespace:
    fields: dict[str, Any] = {
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": 9,
        "speculative_draft_model_path": "/models/eagle3-head",
        "speculative_adaptive": False,
        "speculative_use_rejection_sampling": False,
        "enable_multi_layer_eagle": False,
        "pp_size": 1,
        "max_running_requests": None,
        "disable_overlap_schedule": False,
        "enable_mixed_chunk": True,
        "attention_backend": "triton",
    }
    fields.update(overrides)
    return SimpleNamespace(**fields)


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


def test_validation_rejects_what_echo_cannot_serve(registered: Any) -> None:
    algo = registered.from_string(ALGORITHM)
    algo.validate_server_args(_server_args())
    assert current_args() == EchoArgs()  # exported for the workers, defaults included
    cases = [
        (_server_args(speculative_eagle_topk=1), "topk >= 2"),
        (_server_args(speculative_num_steps=None), "set explicitly"),
        (_server_args(speculative_draft_model_path=None), "--speculative-draft-model-path"),
        (_server_args(speculative_adaptive=True), "--speculative-adaptive"),
        (_server_args(pp_size=2), "pipeline parallelism"),
    ]
    for server_args, message in cases:
        with pytest.raises(PluginConfigError, match=message):
            algo.validate_server_args(server_args)


def test_ragged_serving_is_refused_with_the_reason(
    registered: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, EchoArgs(verify="ragged").to_json())
    with pytest.raises(PluginConfigError, match="no ragged target-verify path"):
        registered.from_string(ALGORITHM).validate_server_args(_server_args())


def test_handle_server_args_turns_off_what_echo_does_not_support(registered: Any) -> None:
    server_args = _server_args()
    registered.from_string(ALGORITHM).handle_server_args(server_args)
    assert server_args.max_running_requests == 48
    assert server_args.disable_overlap_schedule is True
    assert server_args.enable_mixed_chunk is False


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


def _real_server_args(*extra: str) -> Any:
    """SGLang's own ``ServerArgs`` from its own parser (hooks applied: ECHO's flags exported)."""
    server_args_cls = importlib.import_module("sglang.srt.server_args").ServerArgs
    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    server_args_cls.add_cli_args(parser)
    argv = ["--model-path", "/models/target", "--speculative-algorithm", "ECHO",
            "--speculative-draft-model-path", "/models/eagle3-head",
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
            "--speculative-num-draft-tokens", "9"]  # fmt: skip
    return server_args_cls.from_cli_args(parser.parse_args([*argv, *extra]))


@pytest.mark.parametrize("backend", ["triton", "flashinfer", "fa3"])
def test_supported_attention_backends_pass_validation(registered: Any, backend: str) -> None:
    server_args = _real_server_args("--attention-backend", backend)
    registered.from_string(ALGORITHM).validate_server_args(server_args)
    assert current_args() == EchoArgs()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ((), "needs --attention-backend set explicitly"),
        (("--attention-backend", "trtllm_mha"), "--attention-backend trtllm_mha"),
        (("--attention-backend", "torch_native"), "only on triton, flashinfer, fa3"),
        (
            ("--attention-backend", "triton", "--decode-attention-backend", "flashmla"),
            "--decode-attention-backend flashmla",
        ),
    ],
)
def test_unsupported_attention_backends_are_refused_with_the_reason(
    registered: Any, flags: tuple[str, ...], message: str
) -> None:
    server_args = _real_server_args(*flags)
    with pytest.raises(PluginConfigError, match=message):
        registered.from_string(ALGORITHM).validate_server_args(server_args)
