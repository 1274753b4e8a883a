"""The docs speak in dates, not work periods: no "session N" wording in the project's markdown.

"Session 14" means nothing to a reader; a date (and a commit) does. Covers README.md,
docs/**/*.md, packages/*/README.md and the packages' source (docstrings and comments),
including a number on the next line and file names such as ``session25.txt`` (raw outputs are
named by what they hold and the commit that added them).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_SESSION = re.compile(r"sessions?[\s-]*[0-9]", re.IGNORECASE)


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted(ROOT.glob("packages/*/README.md"))
    files += sorted(ROOT.glob("packages/*/src/**/*.py"))
    return [f for f in files if f.is_file()]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_session_numbers(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    hits = [m.group(0) for m in _SESSION.finditer(text)]
    assert not hits, f"{path.relative_to(ROOT)}: say the date instead of {hits}"


def test_pattern() -> None:
    assert _SESSION.search("in Session 24 we")
    assert _SESSION.search("sessions 14-16")
    assert _SESSION.search("session\n17, nothing")
    assert _SESSION.search("make-run/session25.txt")
    assert not _SESSION.search("make-run/three-runs-cf16469.txt")
    assert not _SESSION.search("a session of 3 rounds")
