"""ECHO's SGLang server flags: parsing, per-flag validation, and the hand-off to worker processes.

Flags (all optional; they only mean something with ``--speculative-algorithm ECHO``):

- ``--speculative-echo-budget K|auto``: draft tokens verified per step for the whole batch (roots
  not counted). ``auto``: ``K_max(B) = T0 - B`` with ``--speculative-echo-knee-tokens T0`` (the
  verify pass's latency knee, in tokens, measured on the serving GPU), else ``B (N - 1)``, the
  tokens SGLang's EAGLE would verify, redistributed. Always capped at ``B (N - 1)``.
- ``--speculative-echo-knee-tokens T0``: see above.
- ``--speculative-echo-gate-file PATH``: a calibrated GatePolicy JSON (``echo-sd calibrate``);
  without it no request is ever truncated.
- ``--speculative-echo-max-depth D`` / ``--speculative-echo-max-width W``: ECHO's Dmax and Wmax;
  default ``--speculative-num-steps`` and ``--speculative-eagle-topk`` (EAGLE drafts no deeper or
  wider than that).
- ``--speculative-echo-policy NAME``: an echo-scheduler policy (default ``echo_device``: ECHO's
  choices with no host sync, echo_sglang.fixed_replay; ``echo``: the same choices through the
  packed policy driver; ``eagle2`` reproduces SGLang's own selection, for A/B runs).
- ``--speculative-echo-verify padded|ragged``: verification path (see the README for status).
- ``--speculative-echo-draft-algorithm EAGLE|EAGLE3``: the draft head's kind.

SGLang's ``ServerArgs`` has no room for plugin fields, so the launcher process parses these flags
(see :mod:`echo_sglang.plugin`) and exports them as JSON in the environment variable
:data:`ENV_VAR`, which SGLang's scheduler processes inherit. Engine-API users call
:func:`export_args` before creating ``sglang.Engine``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass
from typing import Literal, cast

from echo_core.errors import EchoError
from echo_scheduler.policies import policy_names

POLICY_NAMES = policy_names(needs_maps=False)
"""``--speculative-echo-policy`` choices: the registered echo-scheduler policies that run without
acceptance maps (echo_scheduler.policies; the floored baselines need maps)."""

ENV_VAR = "ECHO_SGLANG_ARGS"
"""Environment variable carrying :class:`EchoArgs` as JSON from the launcher to the workers."""

VERIFY_MODES = ("padded", "ragged")
DRAFT_ALGORITHMS = ("EAGLE", "EAGLE3")
FLAG_PREFIX = "speculative_echo_"

Budget = int | Literal["auto"]
VerifyMode = Literal["padded", "ragged"]
DraftAlgorithm = Literal["EAGLE", "EAGLE3"]


class PluginConfigError(EchoError):
    """ECHO's SGLang configuration is invalid; the message names the flag and the value."""


@dataclass(frozen=True, slots=True)
class EchoArgs:
    """ECHO's knobs as given on the command line (None: derive from SGLang's EAGLE flags)."""

    budget: Budget = "auto"
    knee_tokens: int | None = None
    gate_file: str | None = None
    max_depth: int | None = None
    max_width: int | None = None
    policy: str = "echo_device"
    verify: VerifyMode = "padded"
    draft_algorithm: DraftAlgorithm = "EAGLE3"

    def __post_init__(self) -> None:
        if self.budget != "auto":
            _check_int("--speculative-echo-budget", self.budget, minimum=1, auto=True)
        for flag, value in (
            ("--speculative-echo-knee-tokens", self.knee_tokens),
            ("--speculative-echo-max-depth", self.max_depth),
            ("--speculative-echo-max-width", self.max_width),
        ):
            if value is not None:
                _check_int(flag, value, minimum=1)
        if self.knee_tokens is not None and self.budget != "auto":
            raise PluginConfigError(
                f"--speculative-echo-knee-tokens={self.knee_tokens} only applies to "
                f"--speculative-echo-budget auto, got --speculative-echo-budget {self.budget}"
            )
        if self.policy not in POLICY_NAMES:
            raise PluginConfigError(
                f"--speculative-echo-policy must be one of {', '.join(POLICY_NAMES)}, "
                f"got {self.policy!r}"
            )
        if self.verify not in VERIFY_MODES:
            raise PluginConfigError(
                f"--speculative-echo-verify must be padded or ragged, got {self.verify!r}"
            )
        if self.draft_algorithm not in DRAFT_ALGORITHMS:
            raise PluginConfigError(
                "--speculative-echo-draft-algorithm must be EAGLE or EAGLE3, "
                f"got {self.draft_algorithm!r}"
            )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> EchoArgs:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PluginConfigError(f"{ENV_VAR} is not JSON ({exc}): {text!r}") from exc
        if not isinstance(raw, dict):
            raise PluginConfigError(f"{ENV_VAR} must hold a JSON object, got {text!r}")
        known = set(EchoArgs.__dataclass_fields__)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise PluginConfigError(f"{ENV_VAR} has unknown keys {unknown}; known: {sorted(known)}")
        return EchoArgs(**raw)

    @staticmethod
    def from_namespace(ns: argparse.Namespace) -> EchoArgs:
        """The flags of :func:`add_echo_args` from a parsed namespace (defaults where unset)."""
        given = {
            name: getattr(ns, FLAG_PREFIX + name)
            for name in EchoArgs.__dataclass_fields__
            if getattr(ns, FLAG_PREFIX + name, None) is not None
        }
        return EchoArgs(**given)


def flags_given(ns: argparse.Namespace) -> list[str]:
    """The ECHO flags set on the command line, as ``--speculative-echo-...`` spellings."""
    return [
        "--" + (FLAG_PREFIX + name).replace("_", "-")
        for name in EchoArgs.__dataclass_fields__
        if getattr(ns, FLAG_PREFIX + name, None) is not None
    ]


def export_args(args: EchoArgs, env: MutableMapping[str, str] | None = None) -> None:
    """Publish ``args`` to this process's environment (inherited by SGLang's workers)."""
    (os.environ if env is None else env)[ENV_VAR] = args.to_json()


def current_args(env: Mapping[str, str] | None = None) -> EchoArgs:
    """The exported :class:`EchoArgs`, or the defaults when none were exported."""
    text = (os.environ if env is None else env).get(ENV_VAR)
    return EchoArgs() if text is None else EchoArgs.from_json(text)


def add_echo_args(parser: argparse.ArgumentParser) -> None:
    """Add the ``--speculative-echo-*`` flags (module docstring); every default is None."""
    g = parser.add_argument_group("ECHO speculative decoding (echo-sglang)")
    g.add_argument(
        "--speculative-echo-budget",
        type=_budget_arg,
        default=None,
        help="draft tokens verified per step for the whole batch, or 'auto' (default)",
    )
    g.add_argument(
        "--speculative-echo-knee-tokens",
        type=_positive_int_arg,
        default=None,
        help="verify-pass latency knee in tokens; makes 'auto' budget = knee - batch size",
    )
    g.add_argument(
        "--speculative-echo-gate-file",
        default=None,
        help="calibrated GatePolicy JSON (echo-sd calibrate); default: never truncate",
    )
    g.add_argument(
        "--speculative-echo-max-depth",
        type=_positive_int_arg,
        default=None,
        help="deepest draft depth ECHO verifies (default --speculative-num-steps)",
    )
    g.add_argument(
        "--speculative-echo-max-width",
        type=_positive_int_arg,
        default=None,
        help="children per expanded node (default --speculative-eagle-topk)",
    )
    g.add_argument(
        "--speculative-echo-policy",
        choices=POLICY_NAMES,
        default=None,
        help="echo-scheduler policy (default echo_device: ECHO with no host sync)",
    )
    g.add_argument(
        "--speculative-echo-verify",
        choices=VERIFY_MODES,
        default=None,
        help="verification path (default padded)",
    )
    g.add_argument(
        "--speculative-echo-draft-algorithm",
        choices=DRAFT_ALGORITHMS,
        default=None,
        help="kind of draft head (default EAGLE3)",
    )


def _check_int(flag: str, value: object, minimum: int, auto: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " or 'auto'" if auto else ""
        raise PluginConfigError(f"{flag} must be an integer >= {minimum}{extra}, got {value!r}")


def _positive_int_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _budget_arg(text: str) -> Budget:
    if text == "auto":
        return cast(Literal["auto"], text)
    try:
        return _positive_int_arg(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be an integer >= 1 or 'auto', got {text!r}"
        ) from None
