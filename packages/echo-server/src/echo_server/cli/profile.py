"""``echo-sd profile show|measure|clear``: the cached verify-cost profiles.

``show`` lists every cached profile (engine/profile_store.py's files) with the machine it was
taken on, whether it matches this machine's CPU and torch, its checks re-run on its stored
rounds, and its milliseconds per row count. ``measure`` loads the model (the engine options) and
measures its profile now, ignoring the cache, and caches it if it settles (exit status 1 if it
never did). ``clear`` deletes the cached profiles.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from echo_scheduler.errors import CostModelError
from echo_scheduler.profile_check import check_profile
from echo_server.cli.options import add_engine_options, load
from echo_server.engine.profile import DEFAULT_CACHE
from echo_server.engine.profile_store import (
    FORMAT,
    MAX_ATTEMPTS,
    ProfileSource,
    cache_path,
    cpu_name,
    machine_identity,
    measure_checked,
    model_timer,
    rounds_from_json,
    save,
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("profile", help="show, measure or clear the cached verify-cost profiles")
    actions = p.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="every cached profile: machine, checks, ms per rows")
    clear = actions.add_parser("clear", help="delete every cached profile")
    measure = actions.add_parser(
        "measure", help="measure this model's profile now; cache it if it passes its checks"
    )
    measure.add_argument(
        "--attempts", type=int, default=MAX_ATTEMPTS, help="measurements before giving up"
    )
    add_engine_options(measure)
    for q in (show, clear, measure):
        q.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)


def run(args: argparse.Namespace) -> int:
    cache: Path = args.cache_dir
    if args.action == "clear":
        files = sorted(cache.glob("*.json")) if cache.is_dir() else []
        for f in files:
            f.unlink()
        print(f"deleted {len(files)} cached profile(s) from {cache}")
        return 0
    if args.action == "show":
        files = sorted(cache.glob("*.json")) if cache.is_dir() else []
        if not files:
            print(f"no cached profile in {cache}")
        for f in files:
            print(describe(f))
        return 0
    loaded = load(args)
    model = loaded.model
    checked = measure_checked(model_timer(model), max_attempts=args.attempts)
    path = cache_path(model, cache)
    if checked.source is ProfileSource.FRESH and path is not None:
        save(path, machine_identity(model), checked)
    ms = " ".join(
        f"{int(t)}:{s * 1e3:.1f}"
        for t, s in zip(checked.profile.tokens, checked.profile.seconds, strict=True)
    )
    c = checked.check
    print(
        f"{checked.source.value} after {checked.attempts} attempt(s): spread {c.spread:.1%}, "
        f"lift {c.lift:.1%}, drift {c.drift:.1%}"
        + (f" -> {path}" if checked.source is ProfileSource.FRESH else " (not cached)")
    )
    print(f"ms by rows: {ms}")
    return 0 if checked.source is ProfileSource.FRESH else 1


def describe(path: Path) -> str:
    """One cached profile in a few lines (module docstring)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"{path.name}: unreadable ({exc})"
    if not isinstance(data, dict):
        return f"{path.name}: not a profile"
    if data.get("format") != FORMAT:
        return f"{path.name}: format {data.get('format')!r}, not {FORMAT} (measured again on load)"
    machine = data.get("machine", {})
    here = machine.get("cpu") == cpu_name() and machine.get("torch") == torch.__version__
    lines = [
        f"{path.name}: measured {data.get('measured', '?')}, "
        f"{'this' if here else 'another'} machine",
        "  " + ", ".join(f"{k}={v}" for k, v in sorted(machine.items())),
    ]
    try:
        rounds = rounds_from_json(data)
    except (KeyError, TypeError, ValueError, IndexError, CostModelError) as exc:
        return "\n".join([*lines, f"  rounds unreadable ({exc})"])
    c = check_profile(rounds)
    verdict = "passes" if c.ok else "fails: " + "; ".join(c.reasons)
    lines.append(
        f"  checks {verdict} (spread {c.spread:.1%}, lift {c.lift:.1%}, drift {c.drift:.1%})"
    )
    cells = zip(rounds.tokens, rounds.medians(), strict=True)
    lines.append("  ms by rows: " + " ".join(f"{t}:{s * 1e3:.1f}" for t, s in cells))
    return "\n".join(lines)
