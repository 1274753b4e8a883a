"""Every relative link and image in the project's markdown resolves to an existing file.

Covers README.md, docs/**/*.md and packages/*/README.md. Links are relative to the file that
holds them; http(s) and mailto links are skipped, and a #anchor is stripped before the check.
Links inside fenced code blocks and inline code are not links and are ignored.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# [text](target) and ![alt](target), with an optional "title" after the target.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# [label]: target reference definitions
_REF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_SKIP = ("http://", "https://", "mailto:")


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted(ROOT.glob("packages/*/README.md"))
    return [f for f in files if f.is_file()]


def links(text: str) -> list[str]:
    text = _FENCE.sub("", text)
    text = _INLINE_CODE.sub("", text)
    return _LINK.findall(text) + _REF.findall(text)


def broken_links(path: Path) -> list[str]:
    bad = []
    for target in links(path.read_text(encoding="utf-8")):
        if target.startswith(_SKIP) or target.startswith("#"):
            continue
        rel = target.split("#", 1)[0].split("?", 1)[0]
        if not rel:
            continue
        if not (path.parent / rel).exists():
            bad.append(target)
    return bad


def test_markdown_files_found() -> None:
    names = {f.relative_to(ROOT).as_posix() for f in markdown_files()}
    assert "README.md" in names
    assert "docs/BENCHMARKS.md" in names


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path: Path) -> None:
    bad = broken_links(path)
    assert not bad, f"{path.relative_to(ROOT)}: links to missing files: {bad}"


def test_checker_sees_links() -> None:
    text = "[a](x.md) ![b](img/y.png) [c](https://e.org) `[d](not-a-link.md)`\n\n[e]: z.md\n"
    assert links(text) == ["x.md", "img/y.png", "https://e.org", "z.md"]
