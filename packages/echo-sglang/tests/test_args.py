"""ECHO's SGLang flags: parsing, clear rejections, resolution against EAGLE's flags (no sglang)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from echo_gating.policy import GatePolicy
from echo_sglang.args import (
    ENV_VAR,
    EchoArgs,
    PluginConfigError,
    add_echo_args,
    current_args,
    export_args,
)
from echo_sglang.config import EagleShape, resolve
from echo_sglang.plugin import from_cli_args_hook

EAGLE = EagleShape(num_steps=3, topk=4, num_draft_tokens=9)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    parser.add_argument("--speculative-algorithm", default=None)
    add_echo_args(parser)
    return parser.parse_args(argv)


def test_flags_parse_into_echo_args() -> None:
    ns = _parse(
        [
            "--speculative-echo-budget", "48", "--speculative-echo-max-depth", "2",
            "--speculative-echo-max-width", "3", "--speculative-echo-policy", "eagle2",
            "--speculative-echo-draft-algorithm", "EAGLE",
        ]
    )  # fmt: skip
    args = EchoArgs.from_namespace(ns)
    assert args == EchoArgs(
        budget=48, max_depth=2, max_width=3, policy="eagle2", draft_algorithm="EAGLE"
    )
    assert EchoArgs.from_namespace(_parse([])) == EchoArgs()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--speculative-echo-budget", "lots"], "must be an integer >= 1 or 'auto', got 'lots'"),
        (["--speculative-echo-budget", "0"], "must be an integer >= 1 or 'auto', got '0'"),
        (["--speculative-echo-max-depth", "0"], "must be an integer >= 1, got '0'"),
        (["--speculative-echo-max-width", "-2"], "must be an integer >= 1, got '-2'"),
        (["--speculative-echo-knee-tokens", "x"], "must be an integer >= 1, got 'x'"),
        (["--speculative-echo-policy", "fastest"], "invalid choice: 'fastest'"),
        # the floored baselines need acceptance maps: not offered
        (["--speculative-echo-policy", "eagle2+floor"], "invalid choice: 'eagle2\\+floor'"),
        (["--speculative-echo-verify", "sparse"], "invalid choice: 'sparse'"),
    ],
)
def test_invalid_flags_are_rejected_with_the_value(argv: list[str], message: str) -> None:
    with pytest.raises(argparse.ArgumentError, match=message.replace("(", r"\(")):
        _parse(argv)


def test_knee_without_auto_budget_is_rejected() -> None:
    ns = _parse(["--speculative-echo-budget", "8", "--speculative-echo-knee-tokens", "64"])
    with pytest.raises(PluginConfigError, match="only applies to --speculative-echo-budget auto"):
        EchoArgs.from_namespace(ns)


def test_echo_flags_without_the_echo_algorithm_are_rejected() -> None:
    ns = _parse(["--speculative-algorithm", "EAGLE3", "--speculative-echo-budget", "8"])
    with pytest.raises(PluginConfigError, match="--speculative-echo-budget only apply with"):
        from_cli_args_hook(None, object, ns)


def test_args_travel_through_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert current_args() == EchoArgs()
    ns = _parse(["--speculative-algorithm", "echo", "--speculative-echo-budget", "auto"])
    from_cli_args_hook(None, object, ns)
    assert current_args() == EchoArgs()
    env: dict[str, str] = {}
    args = EchoArgs(budget="auto", knee_tokens=96, gate_file="/g.json", verify="ragged")
    export_args(args, env)
    assert json.loads(env[ENV_VAR])["knee_tokens"] == 96
    assert current_args(env) == args
    with pytest.raises(PluginConfigError, match="unknown keys \\['depth'\\]"):
        current_args({ENV_VAR: '{"depth": 3}'})


def test_budget_worked_example_from_the_docstring() -> None:
    config = resolve(EchoArgs(knee_tokens=96), EAGLE)
    assert EAGLE.pool_size == 36
    assert config.step_budget(32) == 64
    assert config.step_budget(100) == 0  # past the knee: verify only the roots
    assert resolve(EchoArgs(), EAGLE).step_budget(32) == 32 * 8  # EAGLE's own token count
    assert resolve(EchoArgs(budget=1000), EAGLE).step_budget(4) == 32  # capped at B (N - 1)


@pytest.mark.parametrize(
    ("args", "shape", "message"),
    [
        (EchoArgs(), EagleShape(3, None, 9), "set explicitly"),
        (EchoArgs(), EagleShape(3, 1, 4), "--speculative-eagle-topk >= 2"),
        (EchoArgs(), EagleShape(2, 2, 8), r"must lie in \[2, 7\]"),
        (EchoArgs(max_depth=4), EAGLE, "max-depth=4 exceeds --speculative-num-steps=3"),
        (EchoArgs(max_width=5), EAGLE, "max-width=5 exceeds --speculative-eagle-topk=4"),
        (EchoArgs(policy="echo_dense"), EAGLE, "needs a dense GatePolicy"),
        (EchoArgs(gate_file="/nonexistent/gate.json"), EAGLE, "cannot be used"),
    ],
)
def test_inconsistent_configurations_are_rejected(
    args: EchoArgs, shape: EagleShape, message: str
) -> None:
    with pytest.raises(PluginConfigError, match=message):
        resolve(args, shape)


def test_gate_file_is_loaded_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "gate.json"
    GatePolicy.fixed(0.3, max_depth=3).save(good)
    config = resolve(EchoArgs(gate_file=str(good), policy="echo_fixed"), EAGLE)
    assert config.gate is not None
    assert config.gate.thresholds[2] == pytest.approx(0.3)
    assert config.make_policy().name == "echo_fixed"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(PluginConfigError, match=r"bad\.json' cannot be used"):
        resolve(EchoArgs(gate_file=str(bad)), EAGLE)
