"""References the model tests (and scripts/bench_plain_decode.py) compare the runner with.

- :func:`greedy_generate`: plain greedy decoding over the runner and a KV pool, the
  non-speculative baseline. A ragged batch of prompts is prefilled in one forward (no padding),
  then every step decodes one token per request: each request's last token is the only new row,
  at position ``cache_len``. Requests that emit an end-of-sequence id stop; the loop ends when all
  have stopped or produced ``max_new_tokens``.
- :func:`load_hf_reference`: HF transformers' own implementation of a checkpoint. For a GGUF file
  it builds the model the way ``from_pretrained(dir, gguf_file=...)`` does (transformers' GGUF
  config parser, dequantiser and Q/K un-permutation) without needing ``accelerate``: config
  first, then the model, then its tensors. A HF directory goes through
  ``AutoModelForCausalLM.from_pretrained``.

Neither serves: they lived in ``echo_server.engine.greedy`` and ``echo_server.model.hf_reference``
until 2026-12-05, imported by no production module.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import torch

from echo_server.kv.pool import KVPool
from echo_server.model.attention import ragged_positions
from echo_server.model.errors import ModelLoadError
from echo_server.model.llama import LlamaModel

_NOT_CONFIG = ("model_type", "_model_name_or_path", "architectures")


def greedy_generate(
    model: LlamaModel,
    pool: KVPool,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_ids: Collection[int] = (),
) -> list[list[int]]:
    """Greedy continuations of ``prompts`` (token ids), at most ``max_new_tokens`` each.

    The pool must have room for every prompt plus its continuation; slots are released at the
    end.
    """
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    handles = [pool.add_request() for _ in prompts]
    outputs: list[list[int]] = [[] for _ in prompts]
    try:
        dev = model.device
        lengths = [len(p) for p in prompts]
        tokens = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=dev)
        slots = pool.allocate(len(tokens))
        batch = pool.attention_batch(handles, lengths, slots)
        out = model.forward(tokens, ragged_positions(batch), batch, pool.storage)
        pool.append(handles, slots, lengths)
        last_rows = batch.cu_rows[1:] - 1
        next_tokens = model.logits(out.hidden, last_rows).argmax(-1)  # [B]
        active = list(range(len(prompts)))
        for _ in range(max_new_tokens):
            emitted = next_tokens.tolist()
            still: list[int] = []
            for b, tok in zip(active, emitted, strict=True):
                outputs[b].append(tok)
                if tok not in eos_ids and len(outputs[b]) < max_new_tokens:
                    still.append(b)
            if not still:
                break
            keep = [i for i, b in enumerate(active) if b in still]
            inputs = next_tokens[keep] if len(keep) < len(active) else next_tokens
            active = still
            step_handles = [handles[b] for b in active]
            ones = [1] * len(active)
            slots = pool.allocate(len(active))
            batch = pool.attention_batch(step_handles, ones, slots)
            out = model.forward(inputs, batch.cache_len, batch, pool.storage)
            pool.append(step_handles, slots, ones)
            next_tokens = model.logits(out.hidden).argmax(-1)
    finally:
        for h in handles:
            pool.release_request(h)
    return outputs


def load_hf_reference(path: str | Path, dtype: torch.dtype = torch.float32) -> Any:
    """A ``transformers`` causal LM (eval mode) for a ``.gguf`` file or a HF directory."""
    # Through Any: transformers' own annotations are partial (untyped calls under --strict).
    transformers: Any = importlib.import_module("transformers")
    load_gguf_checkpoint = importlib.import_module(
        "transformers.modeling_gguf_pytorch_utils"
    ).load_gguf_checkpoint

    path = Path(path)
    if path.is_dir():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, local_files_only=True
        )
        return model.eval()
    parsed = load_gguf_checkpoint(str(path))["config"]
    kwargs = {k: v for k, v in parsed.items() if k not in _NOT_CONFIG}
    config = transformers.AutoConfig.for_model(parsed["model_type"], **kwargs)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected or any(k != "lm_head.weight" for k in missing):
        raise ModelLoadError(f"GGUF tensors do not fit: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.to(dtype).eval()
