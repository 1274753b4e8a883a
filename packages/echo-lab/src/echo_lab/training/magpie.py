"""Chat prompts written by the target itself (Magpie, arXiv 2406.08464) for self-distillation.

The head shipped until 2026-12-06 agreed with the target (depth 1) on 0.59-0.66 of held-out
positions of the built prompt kinds but on 0.50 of the target's HumanEval answers and 0.34 of
its MT-Bench answers (scripts/heldout_agreement.py; assets/DATA_CARD.md):
the prompts built from the Python distribution's own text (:mod:`echo_lab.training.instructions`)
are narrower than what chat users ask. An instruction-tuned model given only its chat template
up to the start of a user turn (the *pre-query template*, here ``<|im_start|>user\\n`` after the
system turn) writes a user's query itself; sampled at temperature 1 it writes many different
ones, drawn from the chat distribution it was tuned on. Answering those greedily gives training
contexts like the ones the head meets when serving chat, with no outside data.

Attempt ``i`` samples with seed ``sequence_seed(seed, "magpie/<i>")`` (independent of how many
are asked for; :func:`~echo_lab.training.selfdistill.sequence_seed`), at most ``max_tokens``
tokens. A query is kept when the target ended it itself
(end of turn, not the length cap), it is between ``MIN_CHARS`` and ``MAX_CHARS`` characters
after stripping, no earlier kept query has the same text, and it shares no 8-word run with a
HumanEval prompt or MT-Bench question (:class:`~echo_lab.training.corpus.OverlapFilter`).
Attempts run in rounds of the number still missing (at least ``batch``) until ``count`` are
kept or ``MAX_ATTEMPTS_PER_QUERY * count`` attempts were made. Every attempt is appended to a
JSONL cache (index, whether the target ended it, text), so a rerun with the same seed and a
larger count reuses them and reproduces the same prompts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from echo_core.sampling import SamplingParams
from echo_lab.training.corpus import OverlapFilter
from echo_lab.training.instructions import benchmark_filter
from echo_lab.training.selfdistill import sequence_seed
from echo_scheduler.policies import make_policy
from echo_server.drafting import NullDrafter
from echo_server.engine import Engine, EngineConfig, FinishReason, GenerationRequest
from echo_server.model.loader import LoadedModel
from echo_server.prompts import Prompt

MIN_CHARS = 15
MAX_CHARS = 600
MAX_ATTEMPTS_PER_QUERY = 4
"""Attempts allowed per kept query before :func:`chat_queries` gives up on the rest."""
PREFIX = "magpie"
"""Prompt ids are ``magpie/<attempt>``."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One sampled query: its attempt index, whether the target ended it, and its text."""

    index: int
    ended: bool
    text: str


def pre_query_template(loaded: LoadedModel) -> str:
    """The chat template rendered up to where a user's message would start."""
    marker = "\x00"
    text = loaded.tokenizer.render_chat([{"role": "user", "content": marker}])
    return text[: text.index(marker)]


def _read_cache(path: Path) -> dict[int, Attempt]:
    attempts: dict[int, Attempt] = {}
    if not path.is_file():
        return attempts
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            obj = json.loads(line)
            attempt = Attempt(int(obj["index"]), bool(obj["ended"]), str(obj["text"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{n}: not a query attempt ({exc})") from exc
        attempts[attempt.index] = attempt
    return attempts


def _sample(
    loaded: LoadedModel,
    indices: list[int],
    seed: int,
    max_tokens: int,
    temperature: float,
    batch: int,
) -> list[Attempt]:
    """Sample the queries of attempts ``indices`` in one batched run."""
    prefix = pre_query_template(loaded)
    engine = Engine(
        loaded.model,
        loaded.tokenizer,
        make_policy("plain"),
        NullDrafter(),
        EngineConfig(budget=0, max_batch=batch, kv_slots=batch * (max_tokens + 64) + 64),
    )
    for i in indices:
        sid = f"{PREFIX}/{i}"
        params = SamplingParams(temperature, max_tokens=max_tokens, seed=sequence_seed(seed, sid))
        engine.submit(GenerationRequest(sid, prompt=prefix, chat=False, params=params))
    out: list[Attempt] = []
    for event in engine.run():
        if event.finish_reason is None:
            continue
        request = engine.pop_finished(event.request_id)
        text = loaded.tokenizer.decode(request.output_ids, skip_special_tokens=True).strip()
        ended = event.finish_reason is FinishReason.EOS
        out.append(Attempt(int(event.request_id.split("/")[1]), ended, text))
    return sorted(out, key=lambda a: a.index)


def _kept(attempts: list[Attempt], count: int, bench: OverlapFilter) -> list[Prompt]:
    """The first ``count`` of ``attempts`` (in order) the filter keeps (module docstring)."""
    kept: list[Prompt] = []
    seen: set[str] = set()
    for a in attempts:
        if len(kept) == count:
            break
        fits = MIN_CHARS <= len(a.text) <= MAX_CHARS
        if a.ended and fits and a.text not in seen and bench.clean(a.text):
            seen.add(a.text)
            kept.append(Prompt(f"{PREFIX}/{a.index}", a.text, True))
    return kept


def chat_queries(
    loaded: LoadedModel,
    count: int,
    cache: Path,
    seed: int = 0,
    max_tokens: int = 96,
    temperature: float = 1.0,
    batch: int = 64,
) -> list[Prompt]:
    """``count`` chat prompts the target wrote itself (module docstring), in attempt order."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    attempts = _read_cache(cache)
    bench = benchmark_filter()
    limit = MAX_ATTEMPTS_PER_QUERY * count
    while True:
        tried = next((i for i in range(limit) if i not in attempts), limit)  # cached in a row
        kept = _kept([attempts[i] for i in range(tried)], count, bench)
        if len(kept) == count or tried >= limit:
            return kept
        todo = list(range(tried, min(limit, tried + max(batch, count - len(kept)))))
        new = _sample(loaded, todo, seed, max_tokens, temperature, batch)
        cache.parent.mkdir(parents=True, exist_ok=True)
        with cache.open("a", encoding="utf-8") as f:
            for a in new:
                f.write(json.dumps({"index": a.index, "ended": a.ended, "text": a.text}) + "\n")
                attempts[a.index] = a
