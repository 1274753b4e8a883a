"""The policy registry: every scheduling policy under one name, made by name.

As SGLang registers its speculative algorithms, a policy is registered once with
:func:`register_policy` (its name, a factory ``(config, gate) -> policy`` and a one-line summary)
and built with :func:`make_policy`; the lists every front end offers (``echo-sd policies``, its
``--policy`` choices, the SGLang plugin's ``--speculative-echo-policy``) are read from here, not
kept by hand. The built-in policies are registered by :mod:`echo_scheduler.policies`.

- ``needs_maps``: the policy needs a :class:`~echo_gating.policy.GatePolicy` with calibrated
  acceptance maps (the floored baselines); :func:`make_policy` refuses it any other gate.
- ``gate_mode``: the policy is a gate-mode ablation; :func:`make_policy` refuses a gate of another
  mode, so an ablation is never mislabelled.
- ``engine_offered``: ``echo-sd``'s ``--policy`` offers it (the rest are for the replay, the
  simulator and the SGLang plugin).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from echo_gating.policy import GateMode, GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.errors import PolicyError
from echo_scheduler.interface import BasePolicy

PolicyFactory = Callable[[PolicyConfig, GatePolicy | None], BasePolicy]
"""Builds a fresh policy from its configuration and its gate (None: the policy's default)."""


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """One registered policy (module docstring)."""

    name: str
    factory: PolicyFactory
    summary: str
    needs_maps: bool = False
    gate_mode: GateMode | None = None
    engine_offered: bool = False


_REGISTRY: dict[str, PolicySpec] = {}


def register_policy(
    name: str,
    factory: PolicyFactory,
    *,
    summary: str,
    needs_maps: bool = False,
    gate_mode: GateMode | None = None,
    engine_offered: bool = False,
) -> PolicySpec:
    """Register ``factory`` under ``name`` (module docstring); a name is registered once."""
    if not name or name != name.strip():
        raise PolicyError(f"a policy name must be non-empty without spaces around, got {name!r}")
    if name in _REGISTRY:
        raise PolicyError(f"policy {name!r} is already registered")
    spec = PolicySpec(name, factory, summary, needs_maps, gate_mode, engine_offered)
    _REGISTRY[name] = spec
    return spec


def policy_spec(name: str) -> PolicySpec:
    """The registered policy ``name``; an unknown name raises, listing the known ones."""
    spec = _REGISTRY.get(name)
    if spec is None:
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(_REGISTRY)}")
    return spec


def policy_names(
    *, needs_maps: bool | None = None, engine_offered: bool | None = None
) -> tuple[str, ...]:
    """Registered names in registration order, optionally only those with the given
    ``needs_maps`` / ``engine_offered`` (None: either)."""
    return tuple(
        s.name
        for s in _REGISTRY.values()
        if (needs_maps is None or s.needs_maps == needs_maps)
        and (engine_offered is None or s.engine_offered == engine_offered)
    )


def make_policy(
    name: str, config: PolicyConfig | None = None, gate: GatePolicy | None = None
) -> BasePolicy:
    """A fresh policy ``name`` with ``config`` (default: high concurrency) and ``gate`` (the
    gated policies default to never gating), after the registry's checks of the gate."""
    spec = policy_spec(name)
    mode = spec.gate_mode
    if mode is not None and (gate is None or gate.mode is not mode):
        got = None if gate is None else gate.mode.value
        raise PolicyError(f"policy {name!r} needs a {mode.value} GatePolicy, got {got}")
    if spec.needs_maps and (gate is None or gate.acceptance_maps is None):
        raise PolicyError(f"{name} needs a GatePolicy with acceptance maps")
    return spec.factory(config if config is not None else PolicyConfig(), gate)
