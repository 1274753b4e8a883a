"""Read a HF checkpoint directory: ``config.json`` plus ``model*.safetensors``."""

from __future__ import annotations

import json
from pathlib import Path

import structlog
from torch import Tensor

from echo_server.model.config import ModelConfig, config_from_hf
from echo_server.model.errors import ModelLoadError

log = structlog.get_logger(__name__)


def read_hf_dir(path: str | Path) -> tuple[ModelConfig, dict[str, Tensor]]:
    """Config and state dict (checkpoint dtype, HF names) of a safetensors model directory."""
    try:
        from safetensors.torch import load_file
    except ImportError as exc:
        raise ModelLoadError("reading safetensors needs `safetensors` (extra `models`)") from exc
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{path} has no config.json")
    config = config_from_hf(json.loads(config_file.read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors files")
    state: dict[str, Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    log.info("hf_checkpoint_read", path=str(path), arch=config.arch, files=len(files))
    return config, state
