"""HF transformers' own implementation of a checkpoint: the reference for parity and benchmarks.

For a GGUF file this builds the model the way ``from_pretrained(dir, gguf_file=...)`` does
(transformers' GGUF config parser, dequantiser and Q/K un-permutation) without needing
``accelerate``: config first, then the model, then its tensors. A HF directory goes through
``AutoModelForCausalLM.from_pretrained``. Nothing here is used for serving.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch

from echo_server.model.errors import ModelLoadError

_NOT_CONFIG = ("model_type", "_model_name_or_path", "architectures")


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
