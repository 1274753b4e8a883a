"""Model runner: our own Llama-family implementation, checkpoint loading, tokenizer.

Entry points: :func:`load_model` (model + tokenizer), :class:`LlamaModel` (``forward`` over
packed ragged rows, ``logits``), :class:`AttentionBatch` / :class:`AttentionBackend` (the
attention seam), :func:`tree_row_mask` (verify-pass mask).
"""

from echo_server.model.attention import (
    NULL_SLOT,
    AttentionBackend,
    AttentionBatch,
    make_batch,
    ragged_positions,
    tree_row_mask,
)
from echo_server.model.config import ModelConfig, RopeScaling
from echo_server.model.errors import ModelLoadError
from echo_server.model.kernels_attention import KernelsAttention
from echo_server.model.llama import ForwardOutput, LlamaModel, ModelWeights
from echo_server.model.loader import LoadedModel, embedded_gguf_path, load_model, load_model_only
from echo_server.model.tokenizer import IncrementalDetokenizer, Tokenizer, load_tokenizer
from echo_server.model.torch_attention import TorchAttention

__all__ = [
    "NULL_SLOT",
    "AttentionBackend",
    "AttentionBatch",
    "ForwardOutput",
    "IncrementalDetokenizer",
    "KernelsAttention",
    "LlamaModel",
    "LoadedModel",
    "ModelConfig",
    "ModelLoadError",
    "ModelWeights",
    "RopeScaling",
    "Tokenizer",
    "TorchAttention",
    "embedded_gguf_path",
    "load_model",
    "load_model_only",
    "load_tokenizer",
    "make_batch",
    "ragged_positions",
    "tree_row_mask",
]
