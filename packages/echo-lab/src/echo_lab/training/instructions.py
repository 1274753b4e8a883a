"""Draft-training prompts: offline text (:mod:`echo_lab.training.corpus`) made into tasks.

The target answers these prompts itself (self-distillation), so a prompt's only job is to put
the target in the situations the drafter will meet: continuing code (raw, like HumanEval is
sent), writing code on request, explaining and summarising text, open writing, role play and
small reasoning tasks (chat, like MT-Bench). Kinds and their share of the mix:

- ``code``       (raw)  a stdlib function's header + docstring; the target writes the body;
- ``code_chat``  (chat) "Write a Python function ``name`` that <docstring summary>";
- ``explain``    (chat) explain / summarise / give examples for a language-reference excerpt;
- ``package``    (chat) explain or advertise a stdlib module from its one-line summary;
- ``licence``    (chat) explain a paragraph of the Python licence in plain words;
- ``writing``    (chat) templated writing, advice, role play and comparison tasks;
- ``math``       (chat) templated arithmetic word problems with seeded numbers.

Everything is seeded, one random stream per kind plus one for the final order, and every source
ships with the interpreter: the same seed gives the same prompts in the same order on the same
Python version (the stdlib source is part of the data). Prompts sharing an 8-word run with
HumanEval or MT-Bench are dropped.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from echo_lab.training.corpus import (
    OverlapFilter,
    excerpts,
    licence_paragraphs,
    module_summaries,
    pydoc_topics,
    stdlib_functions,
)
from echo_server.prompts import Prompt, humaneval, mtbench

MIX = {
    "code": 0.40,
    "code_chat": 0.10,
    "explain": 0.12,
    "package": 0.05,
    "licence": 0.03,
    "writing": 0.22,
    "math": 0.08,
}
"""Share of each prompt kind (module docstring)."""

SUBJECTS = (
    "a lighthouse keeper",
    "autumn in the mountains",
    "learning a second language",
    "the history of the bicycle",
    "a rainy afternoon in a library",
    "urban gardening",
    "the first day at a new job",
    "volcanoes",
    "a small bakery",
    "public transport",
    "the night sky",
    "recycling plastic",
    "a chess tournament",
    "the water cycle",
    "working from home",
    "an old map",
    "honey bees",
    "a marathon runner",
    "solar power",
    "a family reunion",
    "the invention of printing",
    "saving money",
    "a robot that paints",
    "coral reefs",
    "a train journey across a desert",
    "friendship",
    "time management",
    "the moon landing",
    "a music festival",
    "healthy breakfasts",
    "a village market",
    "deep sea exploration",
    "a forgotten umbrella",
    "team sports",
    "electric cars",
    "the life of a river",
    "a snowy winter morning",
    "online privacy",
    "ancient Rome",
    "a street musician",
    "rainforests",
    "learning to code",
    "a birthday surprise",
    "the human heart",
    "wind turbines",
    "a detective story",
    "kindness to strangers",
    "the Arctic",
    "board games",
    "a science fair",
    "sleep and memory",
    "a lost cat",
    "the printing press",
    "mountain climbing",
    "a cup of tea",
    "remote islands",
    "building a treehouse",
    "the stock market",
    "a museum at night",
    "clean drinking water",
)

WRITING = (
    "Write a short poem about {s}.",
    "Write a short story about {s}.",
    "Write a persuasive paragraph about {s}.",
    "Give me five practical tips related to {s}.",
    "Describe {s} to someone who has never seen it.",
    "Explain {s} to a ten-year-old.",
    "What are the advantages and disadvantages of {s}?",
    "Write a friendly email to a colleague about {s}.",
    "Pretend you are a tour guide and talk about {s}.",
    "Write a news headline and a short article about {s}.",
    "List three interesting facts about {s} and explain each one.",
    "Write a dialogue between two friends discussing {s}.",
    "Summarize the main ideas someone should know about {s}.",
    "Write a haiku about {s}, then explain the imagery.",
    "Compare {s} with {t}. How are they similar and different?",
    "Write a product review that mentions {s}.",
    "Imagine you are a teacher. Plan a short lesson about {s}.",
    "Write a motivational message inspired by {s}.",
    "What questions would a journalist ask about {s}? Give answers too.",
    "Write a diary entry from the point of view of someone thinking about {s}.",
)

EXPLAIN = (
    "Explain the following part of the Python language reference in simple terms:\n\n{x}",
    "Summarize this text in a few sentences:\n\n{x}",
    "Read the text below and write two Python examples that illustrate it.\n\n{x}",
    "What are the key points of the following documentation?\n\n{x}",
    "Rewrite this paragraph so that a beginner can understand it:\n\n{x}",
)

PACKAGE = (
    "A software module is described as: '{x}'. Explain what it is for and who would use it.",
    "Write a short, upbeat announcement for a Python module named {n}: {x}",
    "Explain to a beginner what the Python module {n} does. Its description: {x}",
)

LICENCE = (
    "Explain in plain English what this licence text means:\n\n{x}",
    "Summarize the obligations in the following licence paragraph:\n\n{x}",
)

CODE_CHAT = (
    "Write a Python function `{n}` that does the following: {x}",
    "Implement `{n}` in Python. Description: {x} Include a short docstring.",
)

MATH = (
    "A shop sells pencils for {a} cents each and notebooks for {b} cents each. Sam buys {c} "
    "pencils and {d} notebooks. How much does Sam pay? Explain step by step.",
    "A train travels at {a} km per hour for {c} hours, then at {b} km per hour for {d} hours. "
    "How far does it travel in total? Show your reasoning.",
    "What is {a} times {b}, minus {c}? Explain how you computed it.",
    "A rectangle is {a} meters long and {c} meters wide. What are its area and perimeter?",
    "Anna has {a} apples. She gives {c} to each of her {d} friends. How many are left? "
    "Think step by step.",
    "Solve for x: {c}x + {a} = {b}. Show each step.",
)


def _writing(rng: random.Random) -> str:
    s, t = rng.sample(SUBJECTS, 2)
    return rng.choice(WRITING).format(s=s, t=t)


def _math(rng: random.Random) -> str:
    a, b = rng.randint(12, 240), rng.randint(15, 480)
    c, d = rng.randint(2, 9), rng.randint(2, 7)
    return rng.choice(MATH).format(a=a, b=b, c=c, d=d)


POOL_SIZE = 4000
"""Prompts drawn per seed; a run uses a prefix, so a larger ``count`` extends a smaller one."""


def benchmark_filter() -> OverlapFilter:
    """Drops any text sharing an 8-word run with a HumanEval prompt or an MT-Bench question."""
    return OverlapFilter([p.text for p in humaneval() + mtbench()])


def build_prompts(count: int, seed: int = 0) -> list[Prompt]:
    """The first ``count`` of :data:`POOL_SIZE` prompts in :data:`MIX` proportions (shuffled)."""
    if not 0 < count <= POOL_SIZE:
        raise ValueError(f"count must lie in [1, {POOL_SIZE}], got {count}")
    stubs = list(stdlib_functions())
    random.Random(f"{seed}:stubs").shuffle(stubs)
    docs = [x for _, text in pydoc_topics() for x in excerpts(text, 700) if len(x) > 120]
    modules, licences = module_summaries(), licence_paragraphs()
    makers: dict[str, Callable[[random.Random, int], str]] = {
        "code": lambda r, i: stubs[i % len(stubs)].source,
        "code_chat": lambda r, i: r.choice(CODE_CHAT).format(
            n=stubs[-1 - i % len(stubs)].name, x=stubs[-1 - i % len(stubs)].summary
        ),
        "explain": lambda r, i: r.choice(EXPLAIN).format(x=r.choice(docs)),
        "package": lambda r, i: r.choice(PACKAGE).format(
            n=modules[i % len(modules)][0], x=modules[i % len(modules)][1]
        ),
        "licence": lambda r, i: r.choice(LICENCE).format(x=r.choice(licences)),
        "writing": lambda r, i: _writing(r),
        "math": lambda r, i: _math(r),
    }
    sources = {"code": stubs, "code_chat": stubs, "explain": docs, "package": modules}
    sources["licence"] = licences
    bench = benchmark_filter()
    out: list[Prompt] = []
    seen: set[str] = set()
    for kind, share in MIX.items():
        if not sources.get(kind, SUBJECTS):
            continue  # a source missing on this interpreter: the kind is skipped
        rng = random.Random(f"{seed}:{kind}")
        want, i = round(POOL_SIZE * share), 0
        while want > 0 and i < 20 * POOL_SIZE:
            text = makers[kind](rng, i)
            i += 1
            if text in seen or not bench.clean(text):
                continue
            seen.add(text)
            out.append(Prompt(f"{kind}/{i}", text, kind != "code"))
            want -= 1
    random.Random(f"{seed}:order").shuffle(out)
    return out[:count]
