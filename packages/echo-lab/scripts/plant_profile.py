"""Plant the noisy verify profile of issue #47 in this machine's profile cache.

The profile a loaded AMD EPYC VM measured on 2026-12-05 read 33.8, 49.2, 44.4, 32.9, 56.3 and
37.2 ms at 1, 2, 3, 4, 7 and 8 rows: not a cost curve. Cached by the code of that day it made
`make run` price draft rows as dear and print 0.92x. This script writes it, for the embedded
model's cache key, in one of two forms, so that `make run` afterwards shows what the engine
does with it:

- ``--form legacy`` (default): the medians-only file the code before 2026-12-05 wrote;
- ``--form current``: the checked format (engine/profile_store.py) with this machine's identity,
  every round equal to the medians, so only the profile's shape can reject it.

Row counts the issue did not list are filled in: 5 and 6 rows linearly between 4 and 7, past 8
rows 37.2 ms plus 2.1 ms a row (the interleaved slope measured on that VM, docs/lab). Usage:
``.venv/bin/python packages/echo-lab/scripts/plant_profile.py [--form current]``.
"""

from __future__ import annotations

import argparse
import json

import torch

from echo_server.engine.profile import DEFAULT_CACHE, PROFILE_ROUNDS, PROFILE_TOKENS
from echo_server.engine.profile_store import FORMAT, cache_path, machine_identity
from echo_server.model.loader import load_model

ISSUE_MS = {1: 33.8, 2: 49.2, 3: 44.4, 4: 32.9, 7: 56.3, 8: 37.2}
SLOPE_MS = 2.1


def planted_ms(tokens: tuple[int, ...]) -> list[float]:
    """The issue's points, the gaps filled as the module docstring says."""
    out = []
    for t in tokens:
        if t in ISSUE_MS:
            out.append(ISSUE_MS[t])
        elif t < 7:
            out.append(ISSUE_MS[4] + (ISSUE_MS[7] - ISSUE_MS[4]) * (t - 4) / 3)
        else:
            out.append(ISSUE_MS[8] + SLOPE_MS * (t - 8))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--form", choices=["legacy", "current"], default="legacy")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(dtype=torch.float32).model
    path = cache_path(model, DEFAULT_CACHE)
    assert path is not None
    seconds = [ms / 1000 for ms in planted_ms(PROFILE_TOKENS)]
    data: dict[str, object] = {"tokens": list(PROFILE_TOKENS), "seconds": seconds}
    if args.form == "current":
        data |= {
            "format": FORMAT,
            "machine": machine_identity(model),
            "rounds": [[s] * PROFILE_ROUNDS for s in seconds],
            "reference_s": [seconds[0], seconds[0]],
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    print(f"planted ({args.form}, {args.threads} threads): {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
