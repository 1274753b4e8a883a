"""Let SGLang's Llama capture its final hidden state for an EAGLE-3-style draft.

SGLang captures a target layer's output as the next layer's input
(``layers_to_capture = [id + 1 for id in eagle_aux_hidden_state_layer_ids]``), so nothing
captures after the last layer. ECHO's head reads the target's final hidden state ``f_t`` (the
lm_head input, after the final norm) beside the residual streams of its aux layers
(:mod:`echo_sglang.models.echo_head`). This AFTER hook on ``LlamaModel.forward`` answers a capture
request for the last layer id (``L - 1``, i.e. ``L`` in ``layers_to_capture``) with that final
hidden state, appended after the other captures. Models that request no such id are unchanged.
"""

from __future__ import annotations

from typing import Any

TARGET = "sglang.srt.models.llama.LlamaModel.forward"


def final_capture_hook(result: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER ``LlamaModel.forward``: append the final hidden state when the last id is asked."""
    wanted = getattr(model, "layers_to_capture", None) or ()
    if len(model.layers) not in wanted:
        return None
    if isinstance(result, tuple):
        hidden, aux = result
        aux.append(hidden.clone())
        return hidden, aux
    if hasattr(result, "shape"):  # only the final state was asked for
        return result, [result.clone()]
    return None  # a pipeline stage that is not the last: nothing final to capture
