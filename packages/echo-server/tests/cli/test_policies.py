"""``echo-sd policies`` and ``--policy`` read the policy registry (echo_scheduler.policies)."""

from __future__ import annotations

import argparse

import pytest

from echo_scheduler.policies import policy_names, policy_spec
from echo_server.cli import build_parser, policies
from echo_server.cli.options import POLICY_CHOICES, policy_name


def test_policy_choices_are_the_engine_offered_registered_policies() -> None:
    assert tuple(policy_name(c) for c in POLICY_CHOICES) == policy_names(engine_offered=True)
    assert POLICY_CHOICES[:5] == ("plain", "chain", "static", "eagle2", "global-topk")
    assert {"echo", "echo-dense", "echo-fixed"} <= set(POLICY_CHOICES)
    assert not {"echo-history", "echo-aging", "echo-noledger"} & set(POLICY_CHOICES)


def test_echo_sd_policies_lists_each_choice_with_its_summary(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # policies.run, not cli.main: main configures logging onto capsys's soon-closed stderr
    assert policies.run(argparse.Namespace()) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(POLICY_CHOICES)
    for line, choice in zip(lines, POLICY_CHOICES, strict=True):
        assert line.endswith(policy_spec(policy_name(choice)).summary)


def test_an_unregistered_policy_is_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--policy", "echo-aging", "hi"])
    assert "invalid choice: 'echo-aging'" in capsys.readouterr().err
