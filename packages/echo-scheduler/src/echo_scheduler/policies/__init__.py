"""Every scheduling policy behind one interface, registered by name (policies.registry).

The built-in policies, registered here in this order:

- ``plain``, ``chain``, ``static``, ``eagle2``, ``global_topk``: the baselines;
- ``echo``: ECHO (echo_scheduler.policies.echo) under its calibrated sparse gate;
- ``echo_dense`` and ``echo_fixed``: the paper's gate ablations, ECHO under a gate at every depth
  / one threshold (:func:`~echo_scheduler.policies.registry.make_policy` checks the gate's mode);
- ``echo_noledger``: ECHO without its ledgers and mode chooser (an ablation for the replay);
- ``echo_device``: ECHO with its per-step decisions made in a fixed layout with no host sync
  (echo_scheduler.device), the same plans and selections as ``echo``;
- ``chain+floor``, ``static+floor``, ``eagle2+floor`` (``FLOORED_NAMES``): the fixed baselines
  with ECHO's pre-check and exact cut (echo_scheduler.policies.floored); they need a gate with
  calibrated acceptance maps.

``echo-sd``'s ``--policy`` offers the ``engine_offered`` ones. ``POLICY_NAMES`` (the policies
that run without acceptance maps) and ``FLOORED_NAMES`` are read from the registry once the
built-ins are in; :func:`policy_names` is the live view.
"""

from __future__ import annotations

from echo_gating.policy import GateMode, GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.interface import BasePolicy
from echo_scheduler.policies.echo import EchoPolicy, NoLedgerEchoPolicy
from echo_scheduler.policies.floored import FlooredChain, FlooredEagle2, FlooredStatic
from echo_scheduler.policies.global_topk import GlobalTopKPolicy
from echo_scheduler.policies.plain import PlainPolicy
from echo_scheduler.policies.registry import (
    PolicyFactory,
    PolicySpec,
    make_policy,
    policy_names,
    policy_spec,
    register_policy,
)
from echo_scheduler.policies.uniform import ChainPolicy, Eagle2Policy, StaticTreePolicy


def _echo(name: str, cls: type[EchoPolicy] = EchoPolicy) -> PolicyFactory:
    def factory(config: PolicyConfig, gate: GatePolicy | None) -> BasePolicy:
        return cls(config, gate, name=name)

    return factory


def _device_echo(config: PolicyConfig, gate: GatePolicy | None) -> BasePolicy:
    from echo_scheduler.device.adapter import DeviceEchoPolicy  # imports this package

    return DeviceEchoPolicy(config, gate)


def _floored(cls: type[FlooredChain | FlooredStatic | FlooredEagle2]) -> PolicyFactory:
    def factory(config: PolicyConfig, gate: GatePolicy | None) -> BasePolicy:
        return cls(config, gate)

    return factory


def _register_builtins() -> None:
    register_policy(
        "plain",
        lambda cfg, gate: PlainPolicy(),
        summary="no speculation: one token per step (the reference output)",
        engine_offered=True,
    )
    register_policy(
        "chain",
        lambda cfg, gate: ChainPolicy(cfg),
        summary="classic speculative decoding: one chain of k draft tokens per request",
        engine_offered=True,
    )
    register_policy(
        "static",
        lambda cfg, gate: StaticTreePolicy(cfg),
        summary="a fixed tree shape per request (EAGLE-1 / Medusa style)",
        engine_offered=True,
    )
    register_policy(
        "eagle2",
        lambda cfg, gate: Eagle2Policy(cfg),
        summary="per-request dynamic tree, same size for every request (EAGLE-2, SGLang)",
        engine_offered=True,
    )
    register_policy(
        "global_topk",
        lambda cfg, gate: GlobalTopKPolicy(cfg),
        summary="one budget K over the batch, best path scores first, no gating",
        engine_offered=True,
    )
    for name, mode, summary in (
        ("echo", None, "ECHO: sparse calibrated gates, depth for confident requests, then width"),
        ("echo_dense", GateMode.DENSE, "ECHO ablation: a gate at every depth"),
        ("echo_fixed", GateMode.FIXED, "ECHO ablation: one threshold for all depths"),
    ):
        register_policy(name, _echo(name), summary=summary, gate_mode=mode, engine_offered=True)
    register_policy(
        "echo_noledger",
        _echo("echo_noledger", NoLedgerEchoPolicy),
        summary="ECHO ablation: no draft ledger or mode chooser (drafts whenever the pre-check "
        "lets it)",
    )
    register_policy(
        "echo_device",
        _device_echo,
        summary="ECHO with its per-depth decisions and selection as fixed-shape tensor ops "
        "(no host sync; the same plans and selections as echo)",
        engine_offered=True,
    )
    for name, floored, shape in (
        ("chain+floor", FlooredChain, "a chain"),
        ("static+floor", FlooredStatic, "a static tree"),
        ("eagle2+floor", FlooredEagle2, "an EAGLE-2 tree"),
    ):
        register_policy(
            name,
            _floored(floored),
            summary=f"{shape} with ECHO's pre-check and exact cut (needs acceptance maps)",
            needs_maps=True,
        )


_register_builtins()

POLICY_NAMES = policy_names(needs_maps=False)
"""The registered policies that run without acceptance maps (the built-ins: registration order)."""
FLOORED_NAMES = policy_names(needs_maps=True)
"""The floored baselines: they need a gate with calibrated acceptance maps."""

__all__ = [
    "FLOORED_NAMES",
    "POLICY_NAMES",
    "ChainPolicy",
    "Eagle2Policy",
    "EchoPolicy",
    "GlobalTopKPolicy",
    "NoLedgerEchoPolicy",
    "PlainPolicy",
    "PolicySpec",
    "StaticTreePolicy",
    "make_policy",
    "policy_names",
    "policy_spec",
    "register_policy",
]
