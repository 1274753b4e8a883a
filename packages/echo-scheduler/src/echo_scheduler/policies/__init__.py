"""Every scheduling policy behind one interface, and a constructor by name.

Names: ``plain``, ``chain``, ``static``, ``eagle2``, ``global_topk``, ``echo`` (calibrated sparse
gate), ``echo_dense`` and ``echo_fixed`` (ablations: a gate at every depth / one threshold), and
``echo_reserve`` (ECHO reserving every request's base tree first: the literal reading of
Algorithm 1, kept as an ablation) and ``echo_noledger`` (ECHO without the realised-value check
of echo_scheduler.ledger: it drafts whenever the optimistic pre-check lets it) and
``echo_history`` (ECHO rescaling each request's keys by its realised acceptance,
echo_scheduler.history; it needs the engine's request serials in ``StepBatch.requests``) and
``echo_aging`` (ECHO giving a request that verified no draft row for ``AGING_STEPS`` steps in a
row its best depth-1 node first; also needs the serials) and ``echo_slack`` (ECHO whose gate
truncates only while the budget is full: under slack a truncated request drafts on; any gate).
``echo-sd``'s ``--policy`` offers neither ``echo_slack`` nor ``echo_reserve`` / ``echo_noledger``
(ablations for the replay, the simulator and the SGLang plugin). ``FLOORED_NAMES``
(``chain+floor``, ``static+floor``, ``eagle2+floor``): the fixed baselines with
ECHO's pre-check and exact cut (echo_scheduler.policies.floored); they need a gate with
calibrated acceptance maps.
"""

from __future__ import annotations

from echo_gating.policy import GateMode, GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.errors import PolicyError
from echo_scheduler.history import RequestHistory
from echo_scheduler.interface import BasePolicy
from echo_scheduler.policies.echo import EchoPolicy
from echo_scheduler.policies.floored import FlooredChain, FlooredEagle2, FlooredStatic
from echo_scheduler.policies.global_topk import GlobalTopKPolicy
from echo_scheduler.policies.plain import PlainPolicy
from echo_scheduler.policies.uniform import ChainPolicy, Eagle2Policy, StaticTreePolicy

POLICY_NAMES = (
    "plain",
    "chain",
    "static",
    "eagle2",
    "global_topk",
    "echo",
    "echo_dense",
    "echo_fixed",
    "echo_reserve",
    "echo_noledger",
    "echo_history",
    "echo_aging",
    "echo_slack",
)
FLOORED_NAMES = ("chain+floor", "static+floor", "eagle2+floor")
AGING_STEPS = 4
"""``echo_aging``'s threshold: steps in a row without a verified draft row (set a priori)."""

_ECHO_MODES = {
    "echo": None,
    "echo_dense": GateMode.DENSE,
    "echo_fixed": GateMode.FIXED,
    "echo_reserve": None,
    "echo_noledger": None,
    "echo_history": None,
    "echo_aging": None,
    "echo_slack": None,
}


def make_policy(
    name: str, config: PolicyConfig | None = None, gate: GatePolicy | None = None
) -> BasePolicy:
    """A fresh policy ``name`` with ``config`` (default: high concurrency).

    The ``echo*`` policies take their gate from ``gate`` (default: never gate); ``echo_dense`` and
    ``echo_fixed`` check that the gate has the matching mode, so an ablation is never mislabelled.
    """
    cfg = config if config is not None else PolicyConfig()
    if name == "plain":
        return PlainPolicy()
    if name == "chain":
        return ChainPolicy(cfg)
    if name == "static":
        return StaticTreePolicy(cfg)
    if name == "eagle2":
        return Eagle2Policy(cfg)
    if name == "global_topk":
        return GlobalTopKPolicy(cfg)
    if name in FLOORED_NAMES:
        floored = {
            "chain+floor": FlooredChain,
            "static+floor": FlooredStatic,
            "eagle2+floor": FlooredEagle2,
        }[name]
        return floored(cfg, gate)
    if name in _ECHO_MODES:
        mode = _ECHO_MODES[name]
        if mode is not None and (gate is None or gate.mode is not mode):
            got = None if gate is None else gate.mode.value
            raise PolicyError(f"policy {name!r} needs a {mode.value} GatePolicy, got {got}")
        return EchoPolicy(
            cfg,
            gate,
            name=name,
            reserve_base=name == "echo_reserve",
            learn_drafting=name != "echo_noledger",
            history=RequestHistory() if name == "echo_history" else None,
            aging=AGING_STEPS if name == "echo_aging" else 0,
            slack=name == "echo_slack",
        )
    known = ", ".join((*POLICY_NAMES, *FLOORED_NAMES))
    raise PolicyError(f"unknown policy {name!r}; known: {known}")


__all__ = [
    "FLOORED_NAMES",
    "POLICY_NAMES",
    "ChainPolicy",
    "Eagle2Policy",
    "EchoPolicy",
    "GlobalTopKPolicy",
    "PlainPolicy",
    "StaticTreePolicy",
    "make_policy",
]
