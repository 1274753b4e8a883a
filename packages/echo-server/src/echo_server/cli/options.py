"""Options shared by the subcommands that build an engine, and the builder itself."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

import structlog
import torch

from echo_gating.policy import GateMode, GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.interface import Policy
from echo_scheduler.policies import make_policy, policy_names
from echo_server.assets import DEFAULT_GATE, DEFAULT_HEAD, MIXTURE_GATE, ablation_gate
from echo_server.drafting import NgramDrafter, NullDrafter
from echo_server.drafting.base import Drafter
from echo_server.drafting.eagle_drafter import eagle_drafter_for
from echo_server.drafting.mixture import MixtureDrafter
from echo_server.engine import Engine, EngineConfig
from echo_server.engine.chunking import DEFAULT_PREFILL_CHUNK
from echo_server.engine.profile import DEFAULT_CACHE
from echo_server.model.kernels_attention import KernelsAttention
from echo_server.model.loader import LoadedModel, load_model

log = structlog.get_logger(__name__)

POLICY_CHOICES = tuple(n.replace("_", "-") for n in policy_names(engine_offered=True))
"""``--policy`` choices: the registered policies the engine offers (echo_scheduler.policies),
spelled with dashes."""
DRAFTER_CHOICES = ("auto", "eagle", "ngram", "eagle+ngram")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FIXED_THRESHOLD = 0.3
"""Threshold of the one-threshold ablation when no calibrated policy is given."""
ABLATION_MODES = {"echo_dense": GateMode.DENSE, "echo_fixed": GateMode.FIXED}


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="GGUF file or HF directory (default: embedded)")
    g.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    g.add_argument(
        "--budget",
        type=budget_arg,
        default=16,
        help="K: draft tokens verified per step, or 'auto' (the measured verify-cost knee)",
    )
    g.add_argument("--max-batch", type=int, default=8, help="concurrent requests")
    g.add_argument(
        "--elastic",
        choices=("auto", "on", "off"),
        default="auto",
        help="per-step cost floor: verify a node only if its calibrated acceptance pays for its "
        "row at the measured verify cost (echo_scheduler.elastic); auto: on for ECHO policies",
    )
    g.add_argument("--kv-slots", type=int, default=16384, help="KV pool size in tokens")
    g.add_argument(
        "--prefill-chunk",
        type=prefill_chunk_arg,
        default=DEFAULT_PREFILL_CHUNK,
        help="chunked prefill: at most this many prompt tokens prefilled per step over all "
        "requests, so a long prompt does not stall the running batch (engine/chunking.py); "
        f"'off': every prompt whole in the step that admits it (default {DEFAULT_PREFILL_CHUNK})",
    )
    g.add_argument("--gate", type=Path, default=None, help="calibrated GatePolicy JSON")
    g.add_argument(
        "--drafter",
        choices=DRAFTER_CHOICES,
        default="auto",
        help="eagle: the EAGLE-style head (--head, default: the shipped SmolLM2 head and its "
        "calibrated gate); ngram: prompt lookup; eagle+ngram: the union of both per node "
        "(drafting/mixture.py); auto: eagle+ngram for the embedded model, eagle for a given "
        "--head, else ngram",
    )
    g.add_argument("--head", type=Path, default=None, help="EAGLE draft head (.safetensors)")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    g.add_argument(
        "--profile-cache",
        type=profile_cache_arg,
        default=DEFAULT_CACHE,
        metavar="DIR|off",
        help=f"where the checked verify profile is cached (default {DEFAULT_CACHE}); "
        "off: measure it at every start, cache nothing",
    )
    g.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    g.add_argument(
        "--attention",
        choices=("auto", "torch", "kernels"),
        default="auto",
        help="attention backend: echo-kernels' ragged tree attention (Triton on CUDA) or one "
        "masked SDPA call (fastest on CPU); auto picks kernels on CUDA, torch on CPU",
    )
    g.add_argument(
        "--low-concurrency",
        action="store_true",
        help="the paper's low-load tree shape (depth 8, top-k 10, 60 tokens)",
    )


def _int_or_word(text: str, minimum: int, word: str) -> int | None:
    """``text`` as an integer >= ``minimum``, or None for ``word``; else an argparse error."""
    if text == word:
        return None
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(
            f"expected an integer >= {minimum} or {word!r}, got {text!r}"
        )
    return value


def budget_arg(text: str) -> int | Literal["auto"]:
    value = _int_or_word(text, 0, "auto")
    return "auto" if value is None else value


def prefill_chunk_arg(text: str) -> int | None:
    return _int_or_word(text, 1, "off")


def profile_cache_arg(text: str) -> Path | None:
    """``--profile-cache``: a directory, or ``off`` (None: no cache)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a directory or 'off', got ''")
    return None if text == "off" else Path(text).expanduser()


def policy_name(cli_name: str) -> str:
    return cli_name.replace("-", "_")


def gate_for(name: str, gate_file: Path | None, max_depth: int) -> GatePolicy | None:
    """The GatePolicy a policy runs with: the calibrated file; for the ablations, the file if it
    has their mode, else its calibrated sibling (:func:`~echo_server.assets.ablation_gate`: same
    warm-up records, maps included), else the uncalibrated default (``FIXED_THRESHOLD`` at every
    depth, no maps: logged, since it is not the paper's ablation)."""
    gate = GatePolicy.load(gate_file) if gate_file is not None else None
    mode = ABLATION_MODES.get(name)
    if mode is None or (gate is not None and gate.mode is mode):
        return gate
    if gate_file is not None and ablation_gate(gate_file, mode.value).is_file():
        return GatePolicy.load(ablation_gate(gate_file, mode.value))
    log.warning("ablation_gate_uncalibrated", policy=name, threshold=FIXED_THRESHOLD)
    if mode is GateMode.FIXED:
        return GatePolicy.fixed(FIXED_THRESHOLD, max_depth)
    return GatePolicy.dense(dict.fromkeys(range(1, max_depth + 1), FIXED_THRESHOLD))


def drafter_name(args: argparse.Namespace) -> str:
    """``eagle`` or ``ngram``: what ``--drafter auto`` resolves to (see its help)."""
    choice = getattr(args, "drafter", "auto")
    if choice != "auto":
        return str(choice)
    # The shipped head fits the embedded SmolLM2 target only: auto takes it in union with prompt
    # lookup (and their calibrated gate; the fastest at batch 1, docs/BENCHMARKS.md) for the
    # embedded model, a given --head alone, and prompt lookup otherwise.
    if getattr(args, "head", None) is not None:
        return "eagle"
    embedded = getattr(args, "model", None) is None
    return "eagle+ngram" if embedded and DEFAULT_HEAD.is_file() else "ngram"


def build_policy(cli_name: str, args: argparse.Namespace) -> Policy:
    cfg = (
        PolicyConfig.low_concurrency() if args.low_concurrency else PolicyConfig.high_concurrency()
    )
    name = policy_name(cli_name)
    gate_file = args.gate
    drafter = drafter_name(args)
    shipped_head = drafter != "ngram" and getattr(args, "head", None) is None
    if gate_file is None and shipped_head:  # the shipped head's calibrated gate
        shipped = (MIXTURE_GATE, DEFAULT_GATE) if drafter == "eagle+ngram" else (DEFAULT_GATE,)
        gate_file = next((g for g in shipped if g.is_file()), None)
    return make_policy(name, cfg, gate_for(name, gate_file, cfg.max_depth))


def build_drafter(args: argparse.Namespace, loaded: LoadedModel, cli_policy: str) -> Drafter:
    """The ``--drafter`` choice; plain decoding always gets :class:`NullDrafter` (it must not pay
    for a head that observes every committed row but never drafts)."""
    if policy_name(cli_policy) == "plain":
        return NullDrafter()
    name = drafter_name(args)
    if name == "ngram":
        return NgramDrafter()
    head = eagle_drafter_for(loaded.model, getattr(args, "head", None))
    return MixtureDrafter(head, NgramDrafter()) if name == "eagle+ngram" else head


def load(args: argparse.Namespace) -> LoadedModel:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    use_kernels = args.attention == "kernels" or (
        args.attention == "auto" and device.type == "cuda"
    )
    attention = KernelsAttention() if use_kernels else None
    return load_model(args.model, dtype=DTYPES[args.dtype], device=device, attention=attention)


def elastic_for(cli_policy: str, args: argparse.Namespace) -> bool:
    """``--elastic auto`` turns the per-step cost floor on for the ECHO family only."""
    choice = getattr(args, "elastic", "auto")
    return choice == "on" or (choice == "auto" and policy_name(cli_policy).startswith("echo"))


def build_engine(loaded: LoadedModel, cli_policy: str, args: argparse.Namespace) -> Engine:
    config = EngineConfig(
        budget=args.budget,
        max_batch=args.max_batch,
        kv_slots=args.kv_slots,
        elastic=elastic_for(cli_policy, args),
        prefill_chunk=getattr(args, "prefill_chunk", DEFAULT_PREFILL_CHUNK),
        profile_cache=getattr(args, "profile_cache", DEFAULT_CACHE),
    )
    return Engine(
        loaded.model,
        loaded.tokenizer,
        build_policy(cli_policy, args),
        build_drafter(args, loaded, cli_policy),
        config,
    )
