"""Write long-context prompts (about 1,400 tokens each) for measuring attention over long contexts.

The 16 longest sections of Python's language reference (``pydoc_data.topics``, as the built-in
``summarize`` workload), each cut to its first ``--chars`` characters (:data:`CHARS` by default;
whole paragraphs where they fit) and wrapped in the summarize workload's template, one JSON
object per line for ``--prompts``. Same Python version, same file.

    .venv/bin/python packages/echo-server/scripts/make_long_prompts.py docs/bench/long-context.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from echo_lab.bench.workloads import SUMMARIZE_TEMPLATE, first_paragraphs

CHARS = 6000
COUNT = 16


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--chars", type=int, default=CHARS, help="characters of each excerpt")
    a = p.parse_args()
    from pydoc_data.topics import topics

    longest = sorted(topics.items(), key=lambda kv: (-len(str(kv[1])), str(kv[0])))[:COUNT]
    lines = [
        json.dumps({"prompt": SUMMARIZE_TEMPLATE.format(text=first_paragraphs(str(text), a.chars))})
        for _, text in longest
    ]
    a.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines)} prompts -> {a.out}")


if __name__ == "__main__":
    main()
