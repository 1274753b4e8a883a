"""The one interface every drafting/selection policy implements.

A *policy* decides, per decode step, which nodes the drafter expands and which drafted nodes are
verified. :func:`echo_scheduler.driver.drive_step` is the only loop that calls it over packed
pools (the engine, the simulator and the replays all use it; ``echo_device`` also has a
fixed-layout loop, echo_scheduler.device.driver)::

    plan = policy.begin_step(StepBatch(batch_size=B, budget=K, max_nodes=caps))
    pool = empty_tree(B)
    while not plan.done:
        pool = source.grow(pool, plan)        # top-k children per expanded node, BFS re-packed
        plan = policy.after_depth(pool)
    keep = policy.select(pool)                # [N] bool, ancestor-closed, <= K, <= caps
    tree = select_nodes(pool, keep)           # the SuperTree to verify
    policy.observe(StepOutcome(...))          # after verification: accepted lengths

Plans. The first plan (from ``begin_step``) has ``root_topk`` ([B] int64): how many children of
each request's root to draft (0 = none). Every later plan (from ``after_depth``) has ``expand``
([M] int64, distinct global indices into the pool passed to *that* ``after_depth`` call, all at
the depth drafted last, i.e. leaves of the pool) and ``topk`` ([M] int64 >= 1): how many children
(the drafter's top ones, in rank order) to draft for each. The engine re-packs the pool after every
depth, so global indices are only meaningful for the pool of the same call; request-local indices
of existing nodes never change (new nodes are deeper, so they are appended after them).

Pool order within a request: by depth, then parent, then the child's rank: parents precede
children. ``budget`` K counts draft nodes verified this step across the batch; every request's root
(its last committed token, which yields the bonus token) is always verified and never counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_gating.policy import GatePolicy
from echo_scheduler.cost import LatencyModel
from echo_scheduler.errors import PolicyError


@dataclass(frozen=True, slots=True)
class RowPrice:
    """What a verified row costs this step, for a policy's exact cut (echo_scheduler.cut):
    ``lam`` tokens per second (the run rate a row's time is worth) and ``scale * latency(T)``
    seconds for T verify rows. Only differences over T are used (the cut, ECHO's ledger), so
    ``scale`` is the draft rows' own scale ``s_row`` (echo_scheduler.elastic)."""

    rate: float
    latency: LatencyModel
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.rate < float("inf") and 0.0 < self.scale < float("inf")):
            raise PolicyError(
                f"row price needs rate >= 0 and scale > 0, got {self.rate}, {self.scale}"
            )

    def seconds(
        self, rows: Tensor, scale: Tensor | None = None, table: Tensor | None = None
    ) -> Tensor:
        """``scale * latency(T)`` for every T in ``rows``: float64, same shape. A captured
        step's buffers stand in for the model: ``scale`` a 0-dim float64 tensor in place of the
        float, ``table`` a float64 tensor with ``table[T] = latency(T)`` (the same values, looked
        up: :meth:`latency_table`) in place of evaluating the model."""
        latency = self.latency.latency(rows) if table is None else table[rows]
        return (self.scale if scale is None else scale) * latency

    def latency_table(self, rows: int, device: torch.device) -> Tensor:
        """``latency(T)`` for T = 0..``rows``: [rows + 1] float64 on ``device``, computed there
        by the model's own tensor ops (elementwise, so each entry equals ``latency(T)``)."""
        t = torch.arange(rows + 1, dtype=torch.float64, device=device)
        return self.latency.latency(t)

    def seconds_at(self, rows: float) -> float:
        """:meth:`seconds` at one T, in plain Python (the latency model's ``latency_at``)."""
        return self.scale * self.latency.latency_at(rows)


@dataclass(frozen=True, slots=True)
class StepBatch:
    """What a policy is told at the start of a step."""

    batch_size: int
    budget: int  # K: draft nodes verified this step, whole batch, roots not counted
    max_nodes: Tensor  # [B] int64 >= 0, per-request cap on draft nodes (0 = must not draft)
    min_utility: float = 0.0  # cost floor: verify a node only if its estimated acceptance >= this
    depth_price: float | None = None  # tokens one more drafter call must promise (None: config)
    row_price: RowPrice | None = None  # the exact cut of the selection (None: no cut)
    node_price: float | None = None  # tokens one more expanded node must promise (None: free)
    requests: Tensor | None = None  # [B] int64 request serials (host), stable across steps
    explore_rows: int = 0  # rows to verify whatever their price: the cost model's exploration

    def __post_init__(self) -> None:
        if not isinstance(self.explore_rows, int) or self.explore_rows < 0:
            raise PolicyError(f"explore_rows must be an int >= 0, got {self.explore_rows!r}")
        if self.batch_size < 0:
            raise PolicyError(f"batch_size must be >= 0, got {self.batch_size}")
        if not 0.0 <= self.min_utility < float("inf"):
            raise PolicyError(f"min_utility must be finite and >= 0, got {self.min_utility}")
        for name in ("depth_price", "node_price"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < float("inf"):
                raise PolicyError(f"{name} must be finite and >= 0, got {value}")
        if self.budget < 0:
            raise PolicyError(f"budget must be >= 0, got {self.budget}")
        m = self.max_nodes
        if m.dtype != torch.int64 or m.shape != (self.batch_size,):
            raise PolicyError(
                f"max_nodes must be [{self.batch_size}] int64, got {tuple(m.shape)} {m.dtype}"
            )
        if bool((m < 0).any()):
            raise PolicyError(f"max_nodes must be >= 0, got {m.tolist()}")
        r = self.requests
        if r is not None and (
            r.dtype != torch.int64 or r.shape != (self.batch_size,) or r.device.type != "cpu"
        ):
            raise PolicyError(
                f"requests must be [{self.batch_size}] int64 on the host, got "
                f"{tuple(r.shape)} {r.dtype} on {r.device}"
            )

    @staticmethod
    def uniform(batch_size: int, budget: int, max_nodes: int = 1 << 30) -> StepBatch:
        """Every request capped at ``max_nodes`` (default: effectively uncapped)."""
        caps = torch.full((batch_size,), max_nodes, dtype=torch.int64)
        return StepBatch(batch_size=batch_size, budget=budget, max_nodes=caps)


@dataclass(frozen=True, slots=True)
class DraftPlan:
    """What to draft next; build with :meth:`roots`, :meth:`nodes` or :meth:`finished`."""

    root_topk: Tensor | None  # [B] int64 >= 0 on the first plan of a step, else None
    expand: Tensor  # [M] int64, global indices into the pool of the current call
    topk: Tensor  # [M] int64 >= 1, children to draft per expanded node

    @property
    def done(self) -> bool:
        """Nothing more to draft this step."""
        if self.root_topk is not None:
            return not bool((self.root_topk > 0).any())
        return self.expand.numel() == 0

    @property
    def expansions(self) -> int:
        """Nodes (or roots) this plan expands (a read of the roots' count)."""
        if self.root_topk is not None:
            return int((self.root_topk > 0).sum())
        return int(self.expand.numel())

    @staticmethod
    def roots(root_topk: Tensor) -> DraftPlan:
        empty = torch.zeros(0, dtype=torch.int64, device=root_topk.device)
        return DraftPlan(root_topk=root_topk.to(torch.int64), expand=empty, topk=empty.clone())

    @staticmethod
    def nodes(expand: Tensor, topk: Tensor) -> DraftPlan:
        if expand.shape != topk.shape or expand.dim() != 1:
            raise PolicyError(
                f"expand and topk must be matching 1-D tensors, got {tuple(expand.shape)} "
                f"and {tuple(topk.shape)}"
            )
        keep = topk > 0
        return DraftPlan(
            root_topk=None, expand=expand[keep].to(torch.int64), topk=topk[keep].to(torch.int64)
        )

    @staticmethod
    def finished(device: torch.device | str = "cpu") -> DraftPlan:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return DraftPlan(root_topk=None, expand=empty, topk=empty.clone())


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """Feedback after verification: accepted draft nodes per request (bonus not counted), and,
    when the caller timed it, the wall seconds of the step's draft phase (every drafter call and
    the policy's own work). A policy that prices its drafting (ECHO's ledger) charges the
    measured seconds instead of its modelled per-call and per-node prices."""

    accepted_lengths: Tensor  # [B] int64 >= 0
    verified: Tensor  # [B] int64, draft nodes verified per request
    draft_s: float | None = None  # measured draft-phase seconds (None: not timed)

    def __post_init__(self) -> None:
        if self.draft_s is not None and not (0.0 <= self.draft_s < float("inf")):
            raise PolicyError(f"draft_s must be finite and >= 0, got {self.draft_s}")


@runtime_checkable
class Policy(Protocol):
    """A drafting + selection strategy, driven once per step as the module docstring shows."""

    name: str

    def begin_step(self, batch: StepBatch) -> DraftPlan: ...

    def after_depth(self, pool: TreeBatch) -> DraftPlan: ...

    def select(self, pool: TreeBatch) -> Tensor: ...

    def observe(self, outcome: StepOutcome) -> None: ...

    def active_gate(self) -> GatePolicy | None: ...

    def set_gate(self, gate: GatePolicy) -> bool: ...


class BasePolicy:
    """Shared bookkeeping: the current step's batch and the depth drafted so far.

    Subclasses implement ``_start`` (optional), ``_first_plan`` (called only when the budget and
    batch are non-empty), ``_next_plan``, ``select`` and, if they learn from outcomes,
    ``observe`` (a no-op here).
    """

    name = "base"

    def __init__(self) -> None:
        self._batch: StepBatch | None = None
        self.depth = 0  # deepest depth drafted this step

    @property
    def batch(self) -> StepBatch:
        if self._batch is None:
            raise PolicyError(f"{self.name}: begin_step must be called before after_depth/select")
        return self._batch

    def begin_step(self, batch: StepBatch) -> DraftPlan:
        self._batch = batch
        self.depth = 0
        self._start(batch)
        if batch.budget == 0 or batch.batch_size == 0:
            return DraftPlan.finished(batch.max_nodes.device)
        return self._first_plan(batch)

    def after_depth(self, pool: TreeBatch) -> DraftPlan:
        if pool.batch_size != self.batch.batch_size:
            raise PolicyError(
                f"{self.name}: pool has {pool.batch_size} requests, step has "
                f"{self.batch.batch_size}"
            )
        self.depth += 1
        return self._next_plan(pool)

    def observe(self, outcome: StepOutcome) -> None:
        """Feedback after verification; the baselines learn nothing from it."""

    def active_gate(self) -> GatePolicy | None:
        """The confidence gates this policy drafts under; None: it has none (the baselines)."""
        return None

    def set_gate(self, gate: GatePolicy) -> bool:
        """Use ``gate`` from the next step on (a recalibration); False: this policy has none."""
        return False

    def _start(self, batch: StepBatch) -> None:
        """Reset per-step state; runs on every step, even when nothing will be drafted."""

    def _first_plan(self, batch: StepBatch) -> DraftPlan:
        raise NotImplementedError

    def _next_plan(self, pool: TreeBatch) -> DraftPlan:
        raise NotImplementedError

    def select(self, pool: TreeBatch) -> Tensor:
        raise NotImplementedError
