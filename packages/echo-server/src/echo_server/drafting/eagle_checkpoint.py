"""Draft-head checkpoints: ``<name>.safetensors`` (weights) + ``<name>.json`` (config).

The JSON holds :class:`~echo_server.drafting.eagle_head.EagleHeadConfig` (``format`` names the
layout); the safetensors file holds every head parameter and ``draft_ids``, stored in float16
(the shipped SmolLM2 head is ~8 MB) and cast to float32 on load. The target's embedding and
lm_head rows are not stored: :func:`load_head` attaches them from the target model, after
checking that the head was trained for a target of the same hidden size and vocabulary.

EAGLE-3 checkpoints (HF ``config.json`` + ``model.safetensors`` with ``midlayer.*``, ``fc``,
``d2t``) are not loaded here. This head can read several target layers too (``aux_layers`` in
its config, an added projection of their residual streams), but EAGLE-3's fc maps the three
layers alone to the feature and its decoder layer reads ``[embedding; hidden]`` (2H wide
q/k/v), a different layout; :func:`describe_eagle3` recognises one and says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from echo_core.errors import EchoError
from echo_server.drafting.eagle_head import HEAD_FORMAT, EagleHead, EagleHeadConfig

STORE_DTYPE = torch.float16


class HeadCheckpointError(EchoError):
    """A draft-head checkpoint is missing, corrupt or does not fit the target."""


def head_paths(path: str | Path) -> tuple[Path, Path]:
    """(weights, config) paths for ``path`` given with or without a suffix."""
    p = Path(path)
    stem = p.with_suffix("") if p.suffix in (".safetensors", ".json") else p
    return stem.with_suffix(".safetensors"), stem.with_suffix(".json")


def save_head(head: EagleHead, path: str | Path) -> tuple[Path, Path]:
    """Write the head's weights (float16) and config; returns the two paths."""
    weights, config = head_paths(path)
    weights.parent.mkdir(parents=True, exist_ok=True)
    state = {
        k: (v.detach().to(STORE_DTYPE) if v.is_floating_point() else v.detach()).contiguous()
        for k, v in head.state_dict().items()
    }
    save_file(state, str(weights), metadata={"format": HEAD_FORMAT})
    config.write_text(json.dumps(head.config.to_dict(), indent=2) + "\n", encoding="utf-8")
    return weights, config


def read_config(path: str | Path) -> EagleHeadConfig:
    _, config = head_paths(path)
    if not config.is_file():
        raise HeadCheckpointError(f"draft-head config {config} does not exist")
    try:
        obj = json.loads(config.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise HeadCheckpointError(f"{config}: not JSON ({exc.msg})") from exc
    if not isinstance(obj, dict) or obj.get("format") != HEAD_FORMAT:
        found = obj.get("format") if isinstance(obj, dict) else type(obj).__name__
        raise HeadCheckpointError(f"{config}: format {found!r}, expected {HEAD_FORMAT!r}")
    try:
        return EagleHeadConfig.from_dict(obj)
    except (TypeError, ValueError) as exc:
        raise HeadCheckpointError(f"{config}: {exc}") from exc


def load_head(
    path: str | Path,
    embed: Tensor | None = None,  # [V, H] target embedding
    lm_head: Tensor | None = None,  # [V, H] target lm_head (the embedding when tied)
) -> EagleHead:
    """Load a head (float32, eval mode) and attach the target rows when given.

    Raises :class:`HeadCheckpointError` naming the file for a missing file, a corrupt or
    incomplete weights file, a tensor whose shape disagrees with the config, or a target whose
    vocabulary or hidden size differs from the one the head was trained for.
    """
    weights, _ = head_paths(path)
    config = read_config(path)
    if not weights.is_file():
        raise HeadCheckpointError(f"draft-head weights {weights} do not exist")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise HeadCheckpointError(f"{weights}: unreadable safetensors file ({exc})") from exc
    head = EagleHead(config)
    expected = head.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise HeadCheckpointError(f"{weights}: missing tensors {missing}, unexpected {unexpected}")
    for name, ref in expected.items():
        if tuple(state[name].shape) != tuple(ref.shape):
            raise HeadCheckpointError(
                f"{weights}: {name} has shape {tuple(state[name].shape)}, config implies "
                f"{tuple(ref.shape)}"
            )
        state[name] = state[name].to(ref.dtype)
    ids = state["draft_ids"]
    if ids.numel() and not (int(ids.min()) >= 0 and int(ids.max()) < config.target_vocab_size):
        raise HeadCheckpointError(f"{weights}: draft_ids outside [0, {config.target_vocab_size})")
    head.load_state_dict(state)
    if embed is not None and lm_head is not None:
        for name, t in (("embedding", embed), ("lm_head", lm_head)):
            if tuple(t.shape) != (config.target_vocab_size, config.hidden_size):
                raise HeadCheckpointError(
                    f"{weights} was trained for a target {name} of shape "
                    f"({config.target_vocab_size}, {config.hidden_size}) "
                    f"({config.target or 'unnamed'}), this target's is {tuple(t.shape)}"
                )
        head.attach_target(embed, lm_head)
    head.eval()
    return head


def describe_eagle3(directory: str | Path) -> str | None:
    """A reason string when ``directory`` holds an EAGLE-3 draft checkpoint (unsupported here),
    None when it does not look like one."""
    config = Path(directory) / "config.json"
    if not config.is_file():
        return None
    try:
        obj = json.loads(config.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None
    archs = obj.get("architectures") or []
    if any("Eagle3" in str(a) or "LlamaForCausalLMEagle3" in str(a) for a in archs):
        return (
            f"{directory} is an EAGLE-3 checkpoint ({archs}); its 3-layer feature fusion and "
            "2H-wide attention input are not supported by this head (format "
            f"{HEAD_FORMAT!r})"
        )
    return None
