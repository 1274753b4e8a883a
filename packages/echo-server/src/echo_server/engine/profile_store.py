"""Verify profiles that check themselves: measured until consistent, cached with their raw rounds
and the machine they were taken on, and checked again whenever they are loaded.

Until 2026-12-05 the start-up profile (engine/profile.py) was timed once and cached for good; one
taken while other work ran on the AMD EPYC VM (1 row 33.8 ms, 2 rows 49.2, 3 rows 44.4, 4 rows
32.9, 7 rows 56.3, 8 rows 37.2) priced every draft row as dear, and every later run stopped
drafting (0.92x of plain decoding against 1.48x once re-measured on a quiet machine).

Measurement (:func:`measure_checked`): a reference pass (``T = 1``, the median of
``REFERENCE_PASSES``) is timed, then the profile in ``rounds`` interleaved rounds (one pass per
T per round, the order rotated by one every round, as ``measure_profile_rounds``), then the
reference again, and the raw times go through echo_scheduler.profile_check (rounds agree, the
monotone envelope lifts no point by more than noise, the reference did not drift). A rejected
measurement is repeated, at most ``MAX_ATTEMPTS`` times in all. One that passes is *fresh* and
cached; if none does, the run uses the monotone envelope of the per-point medians over every
attempt's rounds pooled (*unsettled*), logs ``verify_profile_unsettled`` with the reasons, and
caches nothing, so the next start measures again.

Cache (:func:`load_or_measure_checked`): one JSON file per model key, format ``FORMAT``, holding
the raw rounds, the reference pair, the medians used and the machine identity (CPU model name,
torch version, torch threads, the model key of engine/profile.py, the device). On load a format
or identity mismatch, an unreadable file, or a failed check (the same three checks, on the
stored rounds) is logged (``verify_profile_cache_rejected``) and measured again; a profile that
passes is *cached*. The file keeps the medians-only fields (``tokens``, ``seconds``) of the
format before it, so older code still reads it.

Within one process the result is kept per model key and cache directory (:func:`checked_profile`),
so the budget and the elastic floor of one engine share one measurement (an unsettled one too),
and :func:`peek` lets the engine's cost feedback read how it was obtained.

The timing itself is injected (:data:`Timer`: the seconds of one verify pass over T tokens), so
the tests run on a fake clock; :func:`model_timer` is the real one (engine/profile.py's rig).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import structlog
import torch

from echo_scheduler.cost import ProfileCost
from echo_scheduler.errors import CostModelError
from echo_scheduler.profile_check import (
    ProfileCheck,
    ProfileRounds,
    check_profile,
    envelope,
    median,
)
from echo_server.engine.profile import (
    DEFAULT_CACHE,
    PREFIX,
    PROFILE_ROUNDS,
    PROFILE_TOKENS,
    _cache_key,
    _VerifyRig,
)
from echo_server.model.llama import LlamaModel

log = structlog.get_logger(__name__)

FORMAT = "echo-verify-profile/1"
"""The cache file's format; a file of any other (or none: the medians-only files written before
2026-12-05) is measured again."""

MAX_ATTEMPTS = 3
"""Measurements at start-up before an unsettled profile is used: a measurement takes about ten
seconds on the 2-core VM, and a machine still too noisy after three (half a minute) is busy for
longer than start-up should wait; the live correction (echo_scheduler.live_cost) takes over."""

REFERENCE_PASSES = 5
"""Passes of the reference timed before and after the rounds (their median is the reference):
the profile's own rounds per point, so the reference is as robust as one of its points."""

Timer = Callable[[int], float]
"""Seconds of one verify pass over ``T`` tokens (one request: its root and ``T - 1`` draft rows)."""


class ProfileSource(Enum):
    """How the profile in use was obtained."""

    CACHED = "cached"  # loaded from the cache and passed the checks
    FRESH = "fresh"  # measured now, passed the checks (and was cached if there is a cache)
    UNSETTLED = "unsettled"  # measured now, never passed: used for this run only, not cached


@dataclass(frozen=True, slots=True)
class CheckedProfile:
    """A verify profile with its raw timings, their check and where it came from."""

    profile: ProfileCost
    source: ProfileSource
    rounds: ProfileRounds
    check: ProfileCheck
    attempts: int  # measurements taken now (0: loaded from the cache)


def measure_rounds(
    timer: Timer,
    tokens: tuple[int, ...] = PROFILE_TOKENS,
    rounds: int = PROFILE_ROUNDS,
    reference_passes: int = REFERENCE_PASSES,
) -> ProfileRounds:
    """One measurement (module docstring): warm-up, reference, interleaved rounds, reference."""
    if rounds < 1 or reference_passes < 1 or not tokens or min(tokens) < 1:
        raise CostModelError(
            f"need rounds, reference passes >= 1 and token counts >= 1, got {rounds}, "
            f"{reference_passes}, {tokens}"
        )
    order = list(tokens)
    for t in order:  # warm-up
        timer(t)
    before = median([timer(1) for _ in range(reference_passes)])
    times: dict[int, list[float]] = {t: [] for t in order}
    for r in range(rounds):
        k = r % len(order)
        for t in order[k:] + order[:k]:
            times[t].append(timer(t))
    after = median([timer(1) for _ in range(reference_passes)])
    return ProfileRounds(tuple(tokens), tuple(tuple(times[t]) for t in tokens), (before, after))


def measure_checked(
    timer: Timer,
    tokens: tuple[int, ...] = PROFILE_TOKENS,
    rounds: int = PROFILE_ROUNDS,
    max_attempts: int = MAX_ATTEMPTS,
) -> CheckedProfile:
    """Measure until a measurement passes the checks, at most ``max_attempts`` times: FRESH with
    the passing one, else UNSETTLED with the envelope of every attempt's rounds pooled."""
    if max_attempts < 1:
        raise CostModelError(f"need max_attempts >= 1, got {max_attempts}")
    pooled: ProfileRounds | None = None
    for attempt in range(1, max_attempts + 1):
        measured = measure_rounds(timer, tokens, rounds)
        check = check_profile(measured)
        if check.ok:
            return CheckedProfile(
                _profile(measured, monotone=False), ProfileSource.FRESH, measured, check, attempt
            )
        log.info("verify_profile_rejected", attempt=attempt, reasons=list(check.reasons))
        pooled = measured if pooled is None else pooled.pooled(measured)
    assert pooled is not None
    check = check_profile(pooled)
    return CheckedProfile(
        _profile(pooled, monotone=True), ProfileSource.UNSETTLED, pooled, check, max_attempts
    )


def _profile(rounds: ProfileRounds, *, monotone: bool) -> ProfileCost:
    ys = rounds.medians()
    values = envelope(ys) if monotone else list(ys)
    return ProfileCost(tuple(float(t) for t in rounds.tokens), tuple(values))


def load_cached(path: Path, identity: dict[str, str]) -> CheckedProfile | None:
    """The cached profile at ``path`` if it exists, is of this format and machine, and passes
    the checks; else None. A rejected file is left for the next fresh profile to overwrite
    (an unsettled one never does, so it is rejected again at the next start)."""
    if not path.is_file():
        return None
    why: dict[str, object]
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            why = {"reason": "format", "found": str(data.get("format"))}
        elif data.get("machine") != identity:
            found = data.get("machine") or {}
            keys = sorted(k for k in identity if found.get(k) != identity[k])
            why = {"reason": "machine", "differs": keys}
        else:
            rounds = rounds_from_json(data)
            check = check_profile(rounds)
            if check.ok:
                profile = _profile(rounds, monotone=False)
                return CheckedProfile(profile, ProfileSource.CACHED, rounds, check, 0)
            why = {"reason": "check", "failed": list(check.reasons)}
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, CostModelError) as exc:
        why = {"reason": "unreadable", "error": str(exc)}
    log.warning("verify_profile_cache_rejected", path=str(path), **why)
    return None


def rounds_from_json(data: dict[str, Any]) -> ProfileRounds:
    """The raw timings of a cache file's JSON (KeyError, TypeError, ValueError, IndexError or
    CostModelError if they are missing or malformed)."""
    return ProfileRounds(
        tuple(int(t) for t in data["tokens"]),
        tuple(tuple(float(x) for x in r) for r in data["rounds"]),
        (float(data["reference_s"][0]), float(data["reference_s"][1])),
    )


def save(path: Path, identity: dict[str, str], checked: CheckedProfile) -> None:
    """Write ``checked`` (a FRESH profile) to ``path`` atomically (module docstring)."""
    if checked.source is not ProfileSource.FRESH:
        raise CostModelError(f"only a fresh, checked profile is cached, not {checked.source}")
    r, c = checked.rounds, checked.check
    data = {
        "format": FORMAT,
        "machine": identity,
        "measured": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tokens": list(r.tokens),
        "seconds": list(checked.profile.seconds),
        "rounds": [list(x) for x in r.rounds],
        "reference_s": list(r.reference_s),
        "check": {"spread": c.spread, "lift": c.lift, "drift": c.drift},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def load_or_measure_checked(
    path: Path | None,
    identity: dict[str, str],
    timer: Callable[[], Timer],
    tokens: tuple[int, ...] = PROFILE_TOKENS,
    rounds: int = PROFILE_ROUNDS,
    max_attempts: int = MAX_ATTEMPTS,
) -> CheckedProfile:
    """The cached profile at ``path`` if it loads and passes (:func:`load_cached`), else a
    measurement (:func:`measure_checked`, ``timer()`` making the timer only then), cached at
    ``path`` if it settled; logged either way (``verify_profile``)."""
    checked = load_cached(path, identity) if path is not None else None
    if checked is None:
        checked = measure_checked(timer(), tokens, rounds, max_attempts)
        if checked.source is ProfileSource.FRESH and path is not None:
            save(path, identity, checked)
    c = checked.check
    fields = {
        "source": checked.source.value,
        "attempts": checked.attempts,
        "tokens": list(checked.rounds.tokens),
        "ms": [round(s * 1000, 1) for s in checked.profile.seconds],
        "spread": round(c.spread, 4),
        "lift": round(c.lift, 4),
        "drift": round(c.drift, 4),
    }
    if checked.source is ProfileSource.UNSETTLED:
        log.warning("verify_profile_unsettled", cached=False, reasons=list(c.reasons), **fields)
    else:
        log.info("verify_profile", **fields)
    return checked


def cpu_name() -> str:
    """The CPU model as the kernel names it (``/proc/cpuinfo``), else the platform's guess."""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_identity(model: LlamaModel) -> dict[str, str]:
    """What a cached profile must have been taken on (module docstring)."""
    device = model.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    return {
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "threads": str(torch.get_num_threads()),
        "model": _cache_key(model),
        "device": name,
    }


def model_timer(model: LlamaModel, tokens: tuple[int, ...] = PROFILE_TOKENS) -> Timer:
    """The real timer: engine/profile.py's rig, one request after a cached prefix of ``PREFIX``."""
    rig = _VerifyRig(model, 1, PREFIX, max(tokens))
    return lambda t: rig.seconds(t - 1)


def cache_path(model: LlamaModel, cache_dir: Path | None) -> Path | None:
    return cache_dir / f"{_cache_key(model)}.json" if cache_dir is not None else None


_RESULTS: dict[tuple[str, str], CheckedProfile] = {}


def checked_profile(model: LlamaModel, cache_dir: Path | None = DEFAULT_CACHE) -> CheckedProfile:
    """This model's checked profile, obtained once per process and cache directory."""
    key = (_cache_key(model), str(cache_dir))
    if key not in _RESULTS:
        _RESULTS[key] = load_or_measure_checked(
            cache_path(model, cache_dir), machine_identity(model), lambda: model_timer(model)
        )
    return _RESULTS[key]


def peek(model: LlamaModel, cache_dir: Path | None = DEFAULT_CACHE) -> CheckedProfile | None:
    """The profile :func:`checked_profile` obtained in this process, or None (none was)."""
    return _RESULTS.get((_cache_key(model), str(cache_dir)))


def forget() -> None:
    """Drop every profile kept in this process (the next :func:`checked_profile` loads again)."""
    _RESULTS.clear()
