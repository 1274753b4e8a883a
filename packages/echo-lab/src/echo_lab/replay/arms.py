"""The arms a replay compares: ECHO, its ablations, and every fixed baseline over a budget grid.

Fixed baselines get their best configuration: each is replayed at every point of a grid that
includes one and two draft nodes per request, with the draft depth matched to the per-request
size: a chain of n is drafted n deep; an EAGLE-2 tree of n nodes is drafted ``1 + floor(log2
n)`` deep with top-``min(n, 3)`` (1, 2, 3, 4 depths for n = 1, 2, 4, 8; n = 4 is the paper's
depth-3, top-3 tree), so a one-node tree does not pay for three depths of drafting. The report
names each family's best point per cell, chosen in hindsight on the replayed steps: an advantage
no online policy has (and one that makes that point's interval against ECHO optimistic for the
baseline). Plain decoding (K = 0) is an arm of its own.

ECHO's eight arms run with one configuration each and the elastic cost floor of
:mod:`echo_scheduler.elastic` fed by the cost model (the engine's ``--elastic``): a per-request
ceiling of ``ECHO_PER_REQUEST`` draft nodes, K = that times B, and the floor decides how much
of it to spend (with the exact cut). Their gates come from :mod:`echo_lab.replay.gates`,
except ``echo_utility``'s, which is chosen per cell by simulated net utility on warm-up steps
(:mod:`echo_lab.replay.utility`), and ``echo_noledger``'s: the sparse gate, without the
realised-value check of :mod:`echo_scheduler.ledger` (what ``echo`` was before it).

Optional arms (:func:`optional_arms`, run only when ``--arms`` names them or their family):
``<fixed arm>+floor`` (families ``chain+floor``, ``static+floor``, ``eagle2+floor``): every
  fixed grid point offered ECHO's floor, i.e. its pre-check and exact cut over the same
  acceptance maps (echo_scheduler.policies.floored), with the floor fed by the cost model.
``echo_device``: ECHO's arm with its decisions made in the fixed layout (echo_scheduler.device),
  the same decisions as ``echo`` (its replay must match ``echo``'s, row for row); named to time
  its host cost (``schedule_vs_gpu.py``) or to check that equality.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from echo_lab.replay.gates import GATE_NAMES
from echo_scheduler.config import PolicyConfig
from echo_scheduler.errors import PolicyError

ECHO_PER_REQUEST = 8
CHAIN_GRID = (1, 2, 3, 4, 6, 8)
STATIC_GRID = ((2,), (2, 1), (2, 1, 1), (3, 2, 1))
EAGLE2_GRID = (1, 2, 4, 8)
GLOBAL_TOPK_PER_REQUEST = 4
UTILITY_ARM = "echo_utility"
NOLEDGER_ARM = "echo_noledger"
DEVICE_ARM = "echo_device"
GRID_FAMILIES = ("chain", "static", "eagle2")
"""The fixed baselines replayed over a budget grid (each reported at its best point)."""


@dataclass(frozen=True, slots=True)
class Arm:
    """One replayed configuration."""

    name: str  # unique, e.g. "chain/n=2"
    family: str  # plain, chain, static, eagle2, global_topk, echo, echo_nogate, ...
    policy: str  # echo_scheduler.policies.make_policy name
    config: PolicyConfig
    per_request: int  # K = per_request * B
    floor: bool = False  # elastic cost floor from the cost model
    gate: str | None = None  # calibrated gate variant (echo_lab.replay.gates)
    optional: bool = False  # replayed only when named (optional_arms)

    def budget(self, batch: int) -> int:
        return self.per_request * batch


def static_size(branching: Sequence[int]) -> int:
    """Nodes of a static tree: ``sum_d prod_{j <= d} branching[j]``."""
    size, width = 0, 1
    for b in branching:
        width *= b
        size += width
    return size


def default_arms(base: PolicyConfig | None = None) -> list[Arm]:
    """plain, the chain / static / EAGLE-2 grids, global top-K, and the ten ECHO arms."""
    cfg = base or PolicyConfig.high_concurrency()
    arms = [Arm("plain", "plain", "plain", cfg, 0)]
    arms += [
        Arm(f"chain/n={n}", "chain", "chain", replace(cfg, chain_length=n), n) for n in CHAIN_GRID
    ]
    arms += [
        Arm(
            "static/" + "x".join(map(str, br)),
            "static",
            "static",
            replace(cfg, static_branching=br),
            static_size(br),
        )
        for br in STATIC_GRID
    ]
    arms += [
        Arm(
            f"eagle2/n={n}",
            "eagle2",
            "eagle2",
            replace(cfg, num_draft_tokens=n + 1, base_depth=n.bit_length(), topk=min(n, 3)),
            n,
        )
        for n in EAGLE2_GRID
    ]
    arms.append(
        Arm(
            f"global_topk/n={GLOBAL_TOPK_PER_REQUEST}",
            "global_topk",
            "global_topk",
            cfg,
            GLOBAL_TOPK_PER_REQUEST,
        )
    )
    arms += [
        Arm(g, g, "echo", cfg, ECHO_PER_REQUEST, floor=True, gate=g)
        for g in (*GATE_NAMES, UTILITY_ARM)
    ]
    arms.append(  # ECHO without its realised-value check (echo_scheduler.ledger)
        Arm(
            NOLEDGER_ARM, NOLEDGER_ARM, NOLEDGER_ARM, cfg, ECHO_PER_REQUEST, floor=True, gate="echo"
        )
    )
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise PolicyError(f"arm names must be unique: {names}")
    return arms


def optional_arms(base: PolicyConfig | None = None) -> list[Arm]:
    """The arms a replay runs only when named (module docstring): ``<fixed arm>+floor`` and
    ``echo_device``."""
    cfg = base or PolicyConfig.high_concurrency()
    device = Arm(
        DEVICE_ARM, DEVICE_ARM, DEVICE_ARM, cfg, ECHO_PER_REQUEST, floor=True, gate="echo",
        optional=True,
    )  # fmt: skip
    return [device] + [
        Arm(
            f"{a.name}+floor",
            f"{a.family}+floor",
            f"{a.policy}+floor",
            a.config,
            a.per_request,
            floor=True,
            gate="echo_nogate",  # the acceptance maps, no thresholds
            optional=True,
        )
        for a in default_arms(cfg)
        if a.family in GRID_FAMILIES
    ]


def select_arms(arms: Sequence[Arm], wanted: Sequence[str] | None) -> list[Arm]:
    """Arms whose name or family is in ``wanted`` (every arm but the optional ones when None);
    ``echo`` is always kept (every comparison is against it) and so is ``plain``."""
    if not wanted:
        return [a for a in arms if not a.optional]
    known = {a.name for a in arms} | {a.family for a in arms}
    unknown = sorted(set(wanted) - known)
    if unknown:
        raise PolicyError(f"unknown arms {unknown}; known: {sorted(known)}")
    keep = set(wanted) | {"echo", "plain"}
    return [a for a in arms if a.name in keep or a.family in keep]
