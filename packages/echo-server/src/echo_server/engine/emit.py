"""Step phase 6 (emit): append emitted tokens to a request, stream their text, see if it ended.

Order of checks over the new tokens ``t_1..t_m`` (accepted path + bonus):
1. max_tokens: keep at most ``remaining`` of them (finish LENGTH when the limit is reached);
2. EOS: cut after the first EOS id unless ``ignore_eos`` (finish EOS; its text is not shown);
3. stop strings: cut the text before the earliest stop string (finish STOP).
"""

from __future__ import annotations

from collections.abc import Sequence

from echo_server.engine.request import FinishReason, RequestState, StepEvent, find_stop
from echo_server.model.tokenizer import Tokenizer


def apply_new_tokens(state: RequestState, tokens: Sequence[int], tokenizer: Tokenizer) -> StepEvent:
    """Commit ``tokens`` to ``state.output_ids`` and return the event to stream."""
    reason: FinishReason | None = None
    new = list(tokens[: max(state.remaining, 0)])
    if not state.params.ignore_eos:
        for i, tok in enumerate(new):
            if tok in tokenizer.eos_ids:
                new, reason = new[: i + 1], FinishReason.EOS
                break
    state.output_ids.extend(new)
    shown = [t for t in new if t not in tokenizer.eos_ids] if reason is FinishReason.EOS else new
    text = state.detokenizer.push(shown)
    if reason is None and state.remaining <= 0:
        reason = FinishReason.LENGTH
    if reason is not None:
        text += state.detokenizer.flush()
    before = len(state.text)
    state.text += text
    cut = find_stop(state.text, state.params.stop, before)
    if cut is not None:
        state.text = state.text[:cut]
        text = state.text[before:]
        reason = FinishReason.STOP
    return StepEvent(state.request_id, tuple(new), text, reason)
