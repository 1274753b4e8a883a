"""``echo-sd train-draft``: self-distil the target on offline prompts and train the draft head.

Two resumable stages (``--stage all`` runs both; rerunning the same command continues):

1. generate: the target answers ``--prompts`` training prompts (:mod:`echo_lab.training.
   instructions`, never HumanEval / MT-Bench) with batched greedy plain decoding; the target's
   features are recorded on the way (:mod:`echo_lab.training.selfdistill`), with the
   residual streams after ``--aux-layers`` (default: EAGLE-3's low / middle / high layers);
2. train: draft vocabulary from the generated tokens, the head (reading the recorded aux layers
   unless ``--no-aux``) trained with unrolled depths, checkpointed every ``--checkpoint-every``
   steps (:mod:`echo_lab.training.trainer`).

With ``--archive PATH`` (:mod:`echo_lab.training.archive`) the generate stage first rebuilds the
archived sequences' features by a teacher-forced target forward (minutes, not the hours of
decoding) and restores the chat-query cache, then generates what is missing and archives the
tokens of everything generated; ``--stage archive`` writes the archive from the work dir alone
(to keep a long generation's progress).

Writes the head (``--out``: ``.safetensors`` + ``.json``) and ``<out>.train.json`` with the data
and training statistics (sizes, wall times, held-out teacher-forced top-1 agreement per depth).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
import torch

from echo_lab.training.archive import archive_work, restore_work
from echo_lab.training.dataset import (
    check_fraction,
    coverage,
    draft_vocabulary,
    load_sequences,
    split,
    subsample,
)
from echo_lab.training.instructions import build_prompts
from echo_lab.training.magpie import chat_queries
from echo_lab.training.selfdistill import generate_dataset, stored_aux_layers
from echo_lab.training.trainer import TrainConfig, train
from echo_server.assets import DEFAULT_HEAD
from echo_server.drafting.eagle_checkpoint import head_paths, save_head
from echo_server.drafting.eagle_head import EagleHead, default_config
from echo_server.model.loader import load_model, resolve_source
from echo_server.prompts import Prompt

log = structlog.get_logger(__name__)

DEFAULT_WORK_DIR = Path.home() / ".cache" / "echo-sd" / "train-draft"
DEFAULTS = TrainConfig()


def add_parser(sub: Any) -> None:
    p = sub.add_parser("train-draft", help="self-distil the target and train the EAGLE draft head")
    p.add_argument("--stage", choices=("all", "generate", "train", "archive"), default="all")
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR)
    p.add_argument(
        "--archive",
        type=Path,
        default=None,
        help="token archive (.safetensors.gz) to restore the data from and save it to",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_HEAD, help="head path (.safetensors)")
    p.add_argument("--model", default=None, help="GGUF file or HF directory (default: embedded)")
    p.add_argument("--prompts", type=int, default=2000, help="training prompts to answer")
    p.add_argument(
        "--chat-queries",
        type=int,
        default=0,
        help="chat prompts the target writes itself from its pre-query template (Magpie; "
        "training/magpie.py), answered like the built prompts",
    )
    p.add_argument("--max-tokens", type=int, default=192, help="answer length cap")
    p.add_argument("--gen-batch", type=int, default=64, help="requests decoded together")
    p.add_argument(
        "--samples-per-prompt",
        type=int,
        default=0,
        help="sampled continuations per prompt besides the greedy answer (held-out prompts' "
        "are never used)",
    )
    p.add_argument("--sample-temperature", type=float, default=1.0)
    p.add_argument(
        "--aux-layers",
        type=int,
        nargs="*",
        default=None,
        help="also record the residual stream after these target layers (EAGLE-3 features); "
        "default: low, middle and high layers (1, L/2 - 1, L - 4); no value: none",
    )
    p.add_argument(
        "--no-aux",
        action="store_true",
        help="train a single-feature head even when the data holds aux features",
    )
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--epochs", type=int, default=DEFAULTS.epochs)
    p.add_argument("--lr", type=float, default=DEFAULTS.lr)
    p.add_argument("--depths", type=int, default=DEFAULTS.depths, help="unrolled depths")
    p.add_argument("--max-batch-tokens", type=int, default=DEFAULTS.max_batch_tokens)
    p.add_argument("--checkpoint-every", type=int, default=DEFAULTS.checkpoint_every)
    p.add_argument(
        "--train-fraction",
        type=float,
        default=1.0,
        help="train on a seeded random fraction of the training prompts (a data-scaling "
        "study; the held-out split is unchanged, the draft vocabulary is the subset's)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is fastest on a busy machine)"
    )


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low / middle / high choice: after layers 1, L/2 - 1 and L - 4 (SmolLM2-135M,
    L = 30: 1, 14, 26); fewer for very shallow targets."""
    return tuple(
        sorted({min(i, num_layers - 1) for i in (1, num_layers // 2 - 1, num_layers - 4) if i >= 0})
    )


def aux_layers_for(requested: list[int] | None, num_layers: int) -> tuple[int, ...]:
    """``--aux-layers``: None -> :func:`default_aux_layers`; a list -> sorted, unique, checked."""
    if requested is None:
        return default_aux_layers(num_layers)
    bad = [i for i in requested if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"--aux-layers {bad} outside the target's layers 0..{num_layers - 1}")
    return tuple(sorted(set(requested)))


def interleave(first: Sequence[Prompt], second: Sequence[Prompt]) -> list[Prompt]:
    """Both lists merged in proportion, each in its own order: element ``i`` of a list of ``n``
    at ``(i + 1/2) / n``, ties to ``first``. Generation admits prompts in this order, so a run
    stopped early holds both kinds in the mix the full run would."""
    keyed = [((i + 0.5) / len(first), 0, p) for i, p in enumerate(first)]
    keyed += [((i + 0.5) / len(second), 1, p) for i, p in enumerate(second)]
    return [p for _, _, p in sorted(keyed, key=lambda x: (x[0], x[1]))]


def _timed(path: Path, key: str, seconds: float) -> float:
    """Add ``seconds`` to the running total ``key`` in ``path`` (JSON); return the total."""
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[key] = float(data.get(key, 0.0)) + seconds
    path.write_text(json.dumps(data))
    return float(data[key])


def _error(exc: ValueError) -> int:
    """Report a refused argument or state on stderr; the command's exit status."""
    print(f"echo-sd train-draft: error: {exc}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    try:
        check_fraction(args.train_fraction)
        if args.stage == "archive" and args.archive is None:
            raise ValueError("--stage archive needs --archive PATH")
    except ValueError as exc:
        return _error(exc)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    work: Path = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    data_dir, clock = work / "data", work / "wall_seconds.json"
    chat_cache = work / "chat-queries.jsonl"
    if args.stage == "archive":  # tokens only: the model is not loaded
        try:
            n = archive_work(data_dir, chat_cache, args.archive, resolve_source(args.model).name)
        except ValueError as exc:  # an unreadable archive at that path
            return _error(exc)
        print(f"{n} sequences -> {args.archive} ({args.archive.stat().st_size / 1e6:.1f} MB)")
        return 0
    loaded = load_model(args.model)
    name = loaded.source.name
    if args.stage in ("all", "generate"):
        start = time.perf_counter()
        try:
            aux_layers = aux_layers_for(args.aux_layers, loaded.model.config.num_layers)
            if args.archive is not None and args.archive.is_file():
                restore_work(loaded.model, args.archive, name, data_dir, chat_cache, aux_layers)
            prompts = interleave(
                build_prompts(args.prompts, seed=args.seed),
                chat_queries(loaded, args.chat_queries, chat_cache, seed=args.seed),
            )
            generate_dataset(
                loaded,
                prompts,
                data_dir,
                max_tokens=args.max_tokens,
                max_batch=args.gen_batch,
                aux_layers=aux_layers,
                samples=args.samples_per_prompt,
                temperature=args.sample_temperature,
                seed=args.seed,
            )
            if args.archive is not None:
                archive_work(data_dir, chat_cache, args.archive, name)
        except ValueError as exc:  # bad --prompts / --aux-layers / archive, or other layers
            return _error(exc)
        _timed(clock, "generate", time.perf_counter() - start)
    if args.stage == "generate":
        return 0

    seqs = load_sequences(data_dir)
    train_seqs, heldout = split(seqs)
    train_seqs = subsample(train_seqs, args.train_fraction, args.seed)
    model = loaded.model
    special = sorted(loaded.tokenizer.eos_ids)
    vocab = draft_vocabulary(train_seqs, args.draft_vocab, special)
    stored = stored_aux_layers(data_dir) or ()
    aux_layers = () if args.no_aux else stored
    shape = default_config(
        model.config.hidden_size, model.config.vocab_size, vocab.numel(), name, aux_layers
    )
    head = EagleHead(shape)
    head.draft_ids.copy_(vocab)
    head.attach_target(model.weights.embed, model.weights.lm_head)
    # Start the predicted feature at the target's feature scale (its final-norm gains).
    with torch.no_grad():
        head.final_norm.weight.copy_(model.weights.final_norm.float())
    cfg = TrainConfig(
        epochs=args.epochs,
        lr=args.lr,
        depths=args.depths,
        max_batch_tokens=args.max_batch_tokens,
        checkpoint_every=args.checkpoint_every,
        seed=args.seed,
    )
    try:
        history, train_s = train(head, train_seqs, heldout, cfg, work / "train_state.pt")
    except ValueError as exc:  # a checkpoint of another config or other training data
        return _error(exc)
    weights, config = save_head(head, args.out)
    gen_s = json.loads(clock.read_text()).get("generate", 0.0) if clock.is_file() else 0.0
    report = {
        "target": name,
        "prompts": args.prompts,
        "chat_queries": args.chat_queries,
        "train_fraction": args.train_fraction,
        "sequences": {"train": len(train_seqs), "heldout": len(heldout)},
        "rows": {
            "train": sum(s.features.shape[0] for s in train_seqs),
            "train_generated": sum(len(s.tokens) - 1 - s.prompt_len for s in train_seqs),
            "heldout_generated": sum(len(s.tokens) - 1 - s.prompt_len for s in heldout),
        },
        "draft_vocab": vocab.numel(),
        "draft_vocab_coverage_heldout": coverage(heldout, vocab),
        "head_parameters": head.num_parameters(),
        "train_config": {k: getattr(cfg, k) for k in cfg.__slots__},
        "wall_seconds": {"generate": gen_s, "train": train_s},
        "heldout_top1_by_epoch": [list(h.top1) for h in history],
        "heldout_chain_by_epoch": [list(h.chain) for h in history],
        "heldout_rows": history[-1].rows if history else 0,
        "weights": weights.name,
        "config": config.name,
    }
    report_path = head_paths(args.out)[0].with_suffix(".train.json")
    report_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    top1 = history[-1].top1 if history else ()
    print(f"head -> {weights} ({weights.stat().st_size / 1e6:.1f} MB), report -> {report_path}")
    print(
        "held-out teacher-forced top-1 agreement by depth: " + ", ".join(f"{a:.3f}" for a in top1)
    )
    return 0
