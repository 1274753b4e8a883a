"""Write ECHO's draft head as an SGLang draft-model directory (``EchoEagleHeadForCausalLM``,
packages/echo-sglang/src/echo_sglang/models/echo_head.py), for ``--speculative-draft-model-path``.

    .venv/bin/python scripts/sglang/export_head.py OUT_DIR [--head PATH] [--gguf PATH]

The head's tensors keep their names (``qkv.weight``, ``gate_up.weight``, ...); ``lm_head.weight``
is the target's output rows of the draft vocabulary (the tied embedding for SmolLM2), which
echo-server attaches at load time and SGLang reads from the checkpoint. ``config.json`` holds the
head's shapes under ``echo_head`` and asks the target to capture the residual streams after
``aux_layers`` and after its last layer (``eagle_config.eagle_aux_hidden_state_layer_ids``).
Tensors are stored in float32 (the head's serving precision in echo-server's float32 engine).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from replace_dir import replace_dir
from safetensors.torch import save_file

from echo_server.assets import DEFAULT_HEAD
from echo_server.drafting.eagle_checkpoint import load_head
from echo_server.model.gguf_weights import read_gguf
from echo_server.model.loader import embedded_gguf_path

ARCHITECTURE = "EchoEagleHeadForCausalLM"


def export(head_path: Path, gguf: Path, out: Path) -> Path:
    """Write the draft directory for ``head_path`` (trained for ``gguf``) at ``out``."""
    ckpt = read_gguf(gguf)
    lm_head = ckpt.state.get("lm_head.weight", ckpt.state["model.embed_tokens.weight"])
    head = load_head(head_path, ckpt.state["model.embed_tokens.weight"], lm_head)
    c = head.config
    layers = ckpt.config.num_layers
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in head.state_dict().items()}
    state["draft_ids"] = head.draft_ids.to(torch.int64).contiguous()
    state["lm_head.weight"] = head.out_rows.to(torch.float32).contiguous()
    config = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "vocab_size": c.target_vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "max_position_embeddings": ckpt.config.max_position,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "eagle_config": {
            "use_aux_hidden_state": True,
            "eagle_aux_hidden_state_layer_ids": [*c.aux_layers, layers - 1],
        },
        "echo_head": c.to_dict(),
    }

    def write(tmp: Path) -> None:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    replace_dir(out, write)
    print(f"export_head: wrote {out} ({head.num_parameters()} parameters, aux {c.aux_layers})")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--head", type=Path, default=DEFAULT_HEAD, help="default: the shipped head")
    p.add_argument("--gguf", type=Path, default=None, help="default: the embedded SmolLM2")
    a = p.parse_args(argv)
    export(a.head, a.gguf or embedded_gguf_path(), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
