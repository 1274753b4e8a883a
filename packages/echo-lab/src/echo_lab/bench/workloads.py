"""The benchmark's prompt sets: HumanEval, MT-Bench first turns, summarisation, user JSONL.

- ``humaneval``: the 164 HumanEval stubs in file order, sent raw (the model continues the code).
- ``mtbench``: MT-Bench first turns, interleaved across the 8 categories, sent as chat.
- ``summarize``: built from Python's own language reference (``pydoc_data.topics``, on every
  machine with the same Python version): the sections of at least :data:`MIN_SECTION_CHARS`
  characters, sorted by topic name, each cut to its first paragraphs up to
  :data:`EXCERPT_CHARS` characters and wrapped in :data:`SUMMARIZE_TEMPLATE` (chat). The learned
  draft head's training prompts also draw "explain this excerpt" tasks from the same source
  (:mod:`echo_lab.training.instructions`), so its absolute acceptance on this set may be
  optimistic; every policy shares the drafter, so the comparison between policies is not.
- ``jsonl``: the user's own prompts (``--prompts PATH``; :func:`echo_server.prompts.load_jsonl`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from echo_server.prompts import Prompt, PromptSetError, humaneval, load_jsonl, mtbench

BUILTIN_WORKLOADS = ("humaneval", "mtbench", "summarize")
MIN_SECTION_CHARS = 2000
EXCERPT_CHARS = 1500
SUMMARIZE_TEMPLATE = (
    "Summarize the following section of the Python language reference in three sentences.\n\n{text}"
)


@dataclass(frozen=True, slots=True)
class Workload:
    """A named prompt set; ``prompts`` run in order (the closed loop admits them in turn)."""

    name: str
    prompts: tuple[Prompt, ...]


def first_paragraphs(text: str, max_chars: int) -> str:
    """The leading paragraphs of ``text`` that fit in ``max_chars`` (at least one, truncated)."""
    out = ""
    for para in (p.strip() for p in text.split("\n\n")):
        if not para:
            continue
        if out and len(out) + len(para) + 2 > max_chars:
            break
        out = f"{out}\n\n{para}" if out else para[:max_chars]
    return out


def summarization(limit: int | None = None) -> list[Prompt]:
    """Summarisation prompts from ``pydoc_data.topics`` (module docstring)."""
    from pydoc_data.topics import topics

    sections = sorted((str(k), str(v)) for k, v in topics.items() if len(v) >= MIN_SECTION_CHARS)
    prompts = [
        Prompt(
            f"summarize/{name}",
            SUMMARIZE_TEMPLATE.format(text=first_paragraphs(text, EXCERPT_CHARS)),
            chat=True,
        )
        for name, text in sections
    ]
    return prompts[:limit]


def load_workload(name: str, limit: int | None = None) -> Workload:
    """A built-in workload by name, its first ``limit`` prompts."""
    if name == "humaneval":
        prompts = humaneval(limit)
    elif name == "mtbench":
        prompts = mtbench(limit)
    elif name == "summarize":
        prompts = summarization(limit)
    else:
        raise PromptSetError(f"unknown workload {name!r}; known: {', '.join(BUILTIN_WORKLOADS)}")
    if not prompts:
        raise PromptSetError(f"workload {name!r} has no prompts")
    return Workload(name, tuple(prompts))


def load_workloads(
    names: Sequence[str], limit: int | None, prompts_file: Path | None = None
) -> list[Workload]:
    """Built-in workloads by name, then the user's JSONL (named after the file) if given."""
    out = [load_workload(n, limit) for n in names]
    if prompts_file is not None:
        out.append(Workload(prompts_file.stem, tuple(load_jsonl(prompts_file)[:limit])))
    return out
