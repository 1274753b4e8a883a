"""README.md's usage block stays true to the CLI.

Every line of the fenced block under ``## Usage`` that starts with ``echo-sd`` is parsed by the
real ``echo-sd`` parser exactly as written (every option must exist and take the values shown;
glob patterns must match files of the repository), and its subcommand's ``--help`` must print.
``sim`` hands its options to the replay, so a ``sim --traces`` line is parsed by the replay's
own parser. Nothing is run beyond parsing.
"""

from __future__ import annotations

import contextlib
import glob
import io
import re
import shlex
from pathlib import Path

import pytest

from echo_lab.replay import cli as replay_cli
from echo_server.cli import build_parser, commands, main

ROOT = Path(__file__).resolve().parents[1]


def usage_lines() -> list[str]:
    """The ``echo-sd ...`` lines of the first fenced block after ``## Usage``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Usage", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None, "README.md: no ```bash block under ## Usage"
    lines = []
    for raw in block.group(1).splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line.startswith((".venv/bin/echo-sd ", "echo-sd ")):
            lines.append(line)
    return lines


def expand(words: list[str]) -> list[str]:
    """Glob patterns as a shell in the repository root would expand them (each must match)."""
    out: list[str] = []
    for w in words:
        if any(c in w for c in "*?["):
            found = sorted(glob.glob(w, root_dir=ROOT))
            assert found, f"README.md usage: {w!r} matches no file"
            out.extend(found)
        else:
            out.append(w)
    return out


LINES = usage_lines()


def test_the_usage_block_shows_every_command() -> None:
    shown = {shlex.split(line)[1] for line in LINES}
    assert shown == set(commands()) - {"demo"}, "README.md usage and echo-sd's commands differ"


@pytest.mark.parametrize("line", LINES)
def test_a_usage_line_parses_as_written(line: str) -> None:
    argv = expand(shlex.split(line)[1:])
    table = commands()
    module = table[argv[0]]
    if getattr(module, "PASS_THROUGH", False):
        assert "--traces" in argv, f"no parser to check {line!r} against"
        replay_cli.parse(argv[1:])
        return
    args, extra = build_parser(table).parse_known_args(argv)
    assert not extra, f"README.md usage: {line!r}: unknown arguments {extra}"
    assert args.command == argv[0]


@pytest.mark.parametrize("command", sorted({shlex.split(line)[1] for line in LINES}))
def test_a_usage_command_prints_its_help(command: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert "usage:" in out.getvalue()
