"""Self-distillation data: the target answers training prompts; its features come for free.

Generation uses the engine's batched plain decoding (policy ``plain``). A
:class:`FeatureRecorder` stands in as the engine's drafter: it drafts nothing and keeps what
``observe`` hands every drafter anyway, the committed rows' tokens and the target's final hidden
states. So one generation pass yields, per sequence, tokens ``x_0..x_T`` (prompt + answer) and
features ``f_0..f_{T-1}`` (``f_t`` = the target's last hidden state after reading ``x_t``, whose
lm_head argmax is ``x_{t+1}`` inside the answer): no second target forward is needed.

Shards (``shard_00000.safetensors``, ...) hold ``tokens`` [sum(T+1)] int32, ``features``
[sum(T), H] float16, ``cu_features`` [S+1] int64 and ``prompt_len`` [S] int32; the metadata
lists the prompt ids. With ``aux_layers`` (EAGLE-3-style multi-layer features) they also hold
``aux`` [sum(T), L*H] float16: the residual stream after each listed target layer, concatenated
in list order, and the metadata names the layers. Generation is resumable: sequences already in a
shard are skipped (the layers must match the stored shards'). With ``samples`` each prompt is also
answered by sampling (:data:`SAMPLE_MARK` names those sequences).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import structlog
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm import tqdm

from echo_core.sampling import SamplingParams
from echo_scheduler.policies import make_policy
from echo_server.drafting.base import TargetFeedback
from echo_server.drafting.null import NullDrafter
from echo_server.engine import Engine, EngineConfig, GenerationRequest
from echo_server.model.loader import LoadedModel
from echo_server.prompts import Prompt

log = structlog.get_logger(__name__)

SHARD_GLOB = "shard_*.safetensors"
SAMPLE_MARK = "~s"
"""A sampled continuation's sequence id: ``<prompt id>~s<k>`` (k = 1..samples); the greedy
answer keeps the prompt id."""


def sequence_ids(prompt_id: str, samples: int) -> list[str]:
    """The greedy answer's id, then each sampled continuation's (:data:`SAMPLE_MARK`)."""
    return [prompt_id, *(f"{prompt_id}{SAMPLE_MARK}{k}" for k in range(1, samples + 1))]


def prompt_of(sequence_id: str) -> str:
    """The prompt id a sequence answers (its greedy or a sampled continuation)."""
    return sequence_id.split(SAMPLE_MARK, 1)[0]


def is_sampled(sequence_id: str) -> bool:
    return SAMPLE_MARK in sequence_id


def sequence_seed(seed: int, sequence_id: str) -> int:
    """A sampled sequence's seed, ``crc32("<seed>:<sequence id>")``: the same whatever else is
    generated beside it, so a resumed or larger run samples it alike."""
    return zlib.crc32(f"{seed}:{sequence_id}".encode())


@dataclass(slots=True)
class DistilledSequence:
    """One recorded sequence (prompt + answer)."""

    prompt_id: str
    tokens: list[int]  # T + 1 tokens
    features: Tensor  # [T, H] float16
    prompt_len: int
    aux: Tensor | None = None  # [T, L*H] float16, residual streams after the recorded layers


@dataclass(slots=True)
class _Partial:
    tokens: list[int] = field(default_factory=list)
    features: list[Tensor] = field(default_factory=list)
    aux: list[Tensor] = field(default_factory=list)
    next_token: int = -1


class FeatureRecorder(NullDrafter):
    """A drafter that proposes nothing (:class:`NullDrafter`) and records the target's features
    of committed rows."""

    name = "recorder"

    def __init__(self, aux_layers: Sequence[int] = ()) -> None:
        self.aux_layers = tuple(aux_layers)
        self._partial: dict[str, _Partial] = {}
        self.finished: dict[str, tuple[list[int], Tensor, Tensor | None]] = {}

    def observe(self, feedback: TargetFeedback) -> None:
        cu = feedback.cu_rows.tolist()
        hidden = feedback.hidden.to(torch.float16).cpu()
        aux = torch.cat(feedback.aux, dim=-1).to(torch.float16).cpu() if feedback.aux else None
        tokens = feedback.tokens.tolist()
        for b, rid in enumerate(feedback.request_ids):
            part = self._partial.setdefault(rid, _Partial())
            part.tokens += tokens[cu[b] : cu[b + 1]]
            part.features.append(hidden[cu[b] : cu[b + 1]])
            if aux is not None:
                part.aux.append(aux[cu[b] : cu[b + 1]])
            part.next_token = int(feedback.next_token[b])

    def release(self, request_id: str) -> None:
        part = self._partial.pop(request_id, None)
        if part is not None and part.tokens:
            aux = torch.cat(part.aux) if part.aux else None
            tokens = [*part.tokens, part.next_token]
            self.finished[request_id] = (tokens, torch.cat(part.features), aux)


def done_prompt_ids(out_dir: Path) -> set[str]:
    """Sequence ids (:func:`sequence_ids`) already stored in ``out_dir``'s shards."""
    done: set[str] = set()
    for shard in sorted(out_dir.glob(SHARD_GLOB)):
        done.update(read_shard_meta(shard).prompt_ids)
    return done


class ShardMeta(NamedTuple):
    prompt_ids: list[str]
    aux_layers: tuple[int, ...]


def read_shard_meta(path: Path) -> ShardMeta:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    layers = tuple(int(x) for x in json.loads(meta.get("aux_layers", "[]")))
    return ShardMeta(list(json.loads(meta.get("prompt_ids", "[]"))), layers)


def next_shard_index(out_dir: Path) -> int:
    """One past the highest ``shard_<n>`` in ``out_dir`` (0 without shards): a gap in the
    numbering never makes a new shard overwrite an old one."""
    numbers = [int(p.stem.split("_", 1)[1]) for p in out_dir.glob(SHARD_GLOB)]
    return max(numbers, default=-1) + 1


def read_shard_tokens(path: Path) -> list[tuple[str, list[int], int]]:
    """(sequence id, tokens, prompt length) of every sequence in a shard, without reading its
    features."""
    from safetensors import safe_open

    ids = read_shard_meta(path).prompt_ids
    with safe_open(str(path), framework="pt") as f:
        tokens = f.get_tensor("tokens").tolist()
        cu = f.get_tensor("cu_features").tolist()
        prompt_len = f.get_tensor("prompt_len").tolist()
    return [
        (pid, tokens[cu[i] + i : cu[i + 1] + i + 1], int(prompt_len[i]))
        for i, pid in enumerate(ids)
    ]


def stored_aux_layers(out_dir: Path) -> tuple[int, ...] | None:
    """The aux layers of ``out_dir``'s shards (None without shards); ValueError if they differ."""
    found = {read_shard_meta(p).aux_layers for p in sorted(out_dir.glob(SHARD_GLOB))}
    if len(found) > 1:
        raise ValueError(f"shards in {out_dir} record different aux layers: {sorted(found)}")
    return next(iter(found)) if found else None


def check_aux_layers(out_dir: Path, aux_layers: Sequence[int]) -> None:
    """Raise ValueError unless ``out_dir``'s shards (if any) record ``aux_layers``."""
    stored = stored_aux_layers(out_dir)
    if stored is not None and stored != tuple(aux_layers):
        raise ValueError(
            f"{out_dir} holds shards with aux layers {list(stored)}, not {list(aux_layers)}: "
            "use another work dir or the same layers"
        )


def write_shard(path: Path, seqs: Sequence[DistilledSequence], layers: Sequence[int] = ()) -> None:
    """Store ``seqs`` (with aux features from target ``layers``, if any) in one shard (module
    docstring); written to a temp name, then renamed."""
    layers = list(layers)
    cu = [0]
    for s in seqs:
        cu.append(cu[-1] + s.features.shape[0])
    tensors = {
        "tokens": torch.tensor([t for s in seqs for t in s.tokens], dtype=torch.int32),
        "features": torch.cat([s.features for s in seqs]).contiguous(),
        "cu_features": torch.tensor(cu, dtype=torch.int64),
        "prompt_len": torch.tensor([s.prompt_len for s in seqs], dtype=torch.int32),
    }
    aux = [s.aux for s in seqs if s.aux is not None]
    if aux and len(aux) != len(seqs):
        raise ValueError("either every sequence of a shard has aux features or none has")
    if aux:
        tensors["aux"] = torch.cat(aux).contiguous()
    meta = {"prompt_ids": json.dumps([s.prompt_id for s in seqs]), "aux_layers": json.dumps(layers)}
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.rename(path)


def read_shard(path: Path) -> list[DistilledSequence]:
    """The sequences of one shard."""
    t = load_file(str(path))
    ids = read_shard_meta(path).prompt_ids
    cu = t["cu_features"].tolist()
    tokens = t["tokens"].tolist()
    out = []
    aux = t.get("aux")
    for i, pid in enumerate(ids):
        lo, hi = cu[i], cu[i + 1]
        toks = tokens[lo + i : hi + i + 1]
        seq_aux = aux[lo:hi] if aux is not None else None
        out.append(
            DistilledSequence(pid, toks, t["features"][lo:hi], int(t["prompt_len"][i]), seq_aux)
        )
    return out


def generate_dataset(
    loaded: LoadedModel,
    prompts: Sequence[Prompt],
    out_dir: Path,
    max_tokens: int = 192,
    max_batch: int = 16,
    max_prompt_tokens: int = 320,
    shard_size: int = 64,
    aux_layers: Sequence[int] = (),
    samples: int = 0,
    temperature: float = 1.0,
    seed: int = 0,
) -> int:
    """Answer every prompt not yet stored with greedy plain decoding, and ``samples`` more
    times by sampling at ``temperature`` (seeded per sequence: :func:`sequence_seed`, so a
    resumed run with more prompts samples the stored ones alike); returns new
    sequences. Sampled continuations add contexts the target reaches but its greedy answer does
    not; their labels are still the target's distribution (the features), so they teach the
    same function.

    ``aux_layers``: also record the residual stream after these target layers (module
    docstring); must match what earlier runs stored in ``out_dir``."""
    if samples < 0:
        raise ValueError(f"samples must be >= 0, got {samples}")
    if samples and not temperature > 0:
        raise ValueError(f"sampled continuations need a temperature > 0, got {temperature}")
    out_dir.mkdir(parents=True, exist_ok=True)
    check_aux_layers(out_dir, aux_layers)
    done = done_prompt_ids(out_dir)
    recorder = FeatureRecorder(aux_layers)
    engine = Engine(
        loaded.model,
        loaded.tokenizer,
        make_policy("plain"),
        recorder,
        EngineConfig(budget=0, max_batch=max_batch, kv_slots=max_batch * 640 + 64),
    )
    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    prompt_len: dict[str, int] = {}
    for p in prompts:
        for k, sid in enumerate(sequence_ids(p.prompt_id, samples)):
            if sid in done:
                continue
            params = greedy
            if k:
                params = SamplingParams(
                    temperature, max_tokens=max_tokens, seed=sequence_seed(seed, sid)
                )
            engine.submit(GenerationRequest(sid, prompt=p.text, chat=p.chat, params=params))
            n = len(engine.requests[sid].prompt_ids)
            if n > max_prompt_tokens:
                engine.cancel(sid)
                engine.pop_finished(sid)
                continue
            prompt_len[sid] = n
    shard_index = next_shard_index(out_dir)
    pending: list[DistilledSequence] = []
    written = 0
    with tqdm(total=len(prompt_len), desc="self-distill", unit="seq") as bar:
        for event in engine.run():
            bar.set_postfix(tokens=engine.metrics.emitted_tokens, refresh=False)
            if event.finish_reason is None:
                continue
            engine.pop_finished(event.request_id)
            tokens, feats, aux = recorder.finished.pop(event.request_id)
            n_prompt = prompt_len[event.request_id]
            pending.append(DistilledSequence(event.request_id, tokens, feats, n_prompt, aux))
            bar.update(1)
            if len(pending) >= shard_size or not engine.has_work():
                write_shard(out_dir / f"shard_{shard_index:05d}.safetensors", pending, aux_layers)
                written += len(pending)
                shard_index += 1
                pending = []
    if pending:
        write_shard(out_dir / f"shard_{shard_index:05d}.safetensors", pending, aux_layers)
        written += len(pending)
    log.info("self_distill_done", new_sequences=written, tokens=engine.metrics.emitted_tokens)
    return written
