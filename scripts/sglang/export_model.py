"""Write the embedded target (or any GGUF the engine reads) as a Hugging Face model directory that
SGLang loads: ``config.json`` (LlamaForCausalLM), ``model.safetensors``, the tokenizer files and
``generation_config.json``.

The weights come from the engine's own GGUF reader (``echo_server.model.gguf_weights.read_gguf``:
dequantised to float32, llama.cpp's q/k row permutation undone), so SGLang serves exactly the
tensors ECHO's engine serves. ``--dtype`` picks the stored precision (float32 by default: the
engine's precision, for token-for-token comparisons).

    .venv/bin/python scripts/sglang/export_model.py OUT_DIR [--gguf PATH] [--dtype float32]

Idempotent: an ``OUT_DIR/.complete`` stamp holding the source's size and mtime skips the work.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from replace_dir import replace_dir
from safetensors.torch import save_file

from echo_server.model.gguf_weights import GGUFCheckpoint, read_gguf
from echo_server.model.loader import embedded_gguf_path
from echo_server.model.tokenizer import load_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def hf_config(ckpt: GGUFCheckpoint, dtype: str) -> dict[str, object]:
    """A transformers ``LlamaConfig`` dict of the checkpoint's architecture (Llama only)."""
    c = ckpt.config
    if c.arch != "llama" or c.rope_scaling is not None or ckpt.rope_freq_divisors is not None:
        raise SystemExit(f"export_model: only plain Llama GGUFs are exported, got {c.arch}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position,
        "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": c.attention_bias,
        "torch_dtype": dtype,
    }


def export(gguf: Path, out: Path, dtype: str) -> Path:
    """Write the model directory for ``gguf`` at ``out`` (whole or not at all)."""
    stat = gguf.resolve().stat()
    stamp = json.dumps(
        {
            "gguf": str(gguf.resolve()),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "dtype": dtype,
        }
    )
    if (out / ".complete").is_file() and (out / ".complete").read_text() == stamp:
        print(f"export_model: up to date: {out}")
        return out
    ckpt = read_gguf(gguf)
    config = hf_config(ckpt, dtype)
    state = {k: v.to(DTYPES[dtype]).contiguous() for k, v in ckpt.state.items()}
    if ckpt.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    tok = load_tokenizer(gguf)

    def write(tmp: Path) -> None:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        tok._hf.save_pretrained(str(tmp))
        eos = sorted(tok.eos_ids)
        generation = {"eos_token_id": eos[0] if len(eos) == 1 else eos}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        (tmp / ".complete").write_text(stamp)

    replace_dir(out, write)
    print(f"export_model: wrote {out} ({dtype}, {len(state)} tensors)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--gguf", type=Path, default=None, help="default: the embedded SmolLM2")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    a = p.parse_args(argv)
    export(a.gguf or embedded_gguf_path(), a.out, a.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
