"""Offline raw text for draft-training prompts: text that ships with the Python interpreter.

Every source depends on the Python version only (not on what else is installed), so a seed
gives the same prompts on any machine with the same Python. Each yields text in a sorted order:

- :func:`stdlib_functions`: functions of the standard library that have a docstring, as source
  text from the ``def`` line to the end of the docstring (dedented): HumanEval-*style* code stubs
  that are not HumanEval;
- :func:`pydoc_topics`: the language reference shipped as ``pydoc_data.topics``;
- :func:`module_summaries`: first docstring lines of the stdlib modules;
- :func:`licence_paragraphs`: paragraphs of the Python licence (``LICENSE.txt``).

Benchmark sets must never leak into training: :class:`OverlapFilter` drops any text that shares a
run of ``n`` words with a HumanEval prompt or an MT-Bench turn.
"""

from __future__ import annotations

import ast
import re
import sysconfig
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

STDLIB_SKIP = (
    "test",
    "idlelib",
    "encodings",
    "lib2to3",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "site-packages",
)
_WORD = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class CodeStub:
    """A function's header and docstring (``source``), with its name and docstring's first line."""

    module: str
    name: str
    source: str
    summary: str


def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files(root: Path) -> Iterator[Path]:
    """Public stdlib ``.py`` files (no tests, GUI or private modules), sorted."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if not any(part in STDLIB_SKIP for part in rel.parts) and not rel.name.startswith("_"):
            yield path


def stdlib_functions(max_doc_chars: int = 900, min_doc_chars: int = 40) -> Iterator[CodeStub]:
    """Public documented stdlib functions as header + docstring stubs, sorted by path."""
    root = _stdlib()
    for path in _stdlib_files(root):
        rel = path.relative_to(root)
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines()
        module = ".".join(rel.with_suffix("").parts)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if doc is None or not min_doc_chars <= len(doc) <= max_doc_chars:
                continue
            first = node.body[0]
            if first.end_lineno is None or node.decorator_list:
                continue
            stub = textwrap.dedent("\n".join(lines[node.lineno - 1 : first.end_lineno]))
            yield CodeStub(module, node.name, stub + "\n", doc.strip().splitlines()[0])


def pydoc_topics() -> list[tuple[str, str]]:
    """(topic, text) pairs of the language reference, sorted by topic."""
    from pydoc_data.topics import topics

    return sorted((str(k), str(v)) for k, v in topics.items())


def module_summaries() -> list[tuple[str, str]]:
    """(module, first docstring line) of public stdlib modules, sorted by module name."""
    root = _stdlib()
    out: list[tuple[str, str]] = []
    for path in _stdlib_files(root):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        summary = doc.strip().splitlines()[0].strip() if doc else ""
        if len(summary) > 15:
            out.append((".".join(path.relative_to(root).with_suffix("").parts), summary))
    return sorted(out)


def licence_paragraphs(min_chars: int = 200, max_chars: int = 900) -> list[str]:
    """Paragraphs of the Python licence shipped with the interpreter, sorted, de-duplicated."""
    path = _stdlib() / "LICENSE.txt"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    paras = {" ".join(p.split()) for p in re.split(r"\n\s*\n", text)}
    return sorted(p for p in paras if min_chars <= len(p) <= max_chars)


def excerpts(text: str, max_chars: int) -> list[str]:
    """Split ``text`` into paragraph-aligned chunks of at most ``max_chars`` characters."""
    chunks: list[str] = []
    current = ""
    for para in text.split("\n\n"):
        para = para.strip()
        if not para:
            continue
        if current and len(current) + len(para) + 2 > max_chars:
            chunks.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para[:max_chars]
    if current:
        chunks.append(current)
    return chunks


class OverlapFilter:
    """Rejects text sharing any run of ``n`` consecutive words with the benchmark texts."""

    def __init__(self, benchmark_texts: Iterable[str], n: int = 8) -> None:
        self.n = n
        self._shingles = {s for t in benchmark_texts for s in self._shingle(t)}

    def _shingle(self, text: str) -> set[tuple[str, ...]]:
        words = [w.lower() for w in _WORD.findall(text)]
        return {tuple(words[i : i + self.n]) for i in range(len(words) - self.n + 1)}

    def clean(self, text: str) -> bool:
        """True when ``text`` shares no ``n``-word run with any benchmark text."""
        return self._shingles.isdisjoint(self._shingle(text))
