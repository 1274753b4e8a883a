"""ECHO's fixed-layout scheduler as a policy: ``echo_device``.

:class:`DeviceEchoPolicy` lets :class:`~echo_scheduler.device.echo_step.FixedEchoStep` make a
step's per-depth decisions and its selection; the host keeps what
:class:`~echo_scheduler.policies.echo.EchoPolicy` decides once per step (the pre-check, the mode
chooser and its ledgers, exploration), so the two policies differ only in where a step's
decisions are made; the tests pin them to the same plans and selections. Two ways to drive it:

- in the fixed layout's own loop (echo_scheduler.device.driver: ``begin_fixed`` /
  ``fixed_depth`` / ``fixed_select``), by a source of slabs: the SGLang plugin's EAGLE pool,
  or any packed source behind :class:`~echo_scheduler.device.packed.PackedSlabs` (the engine,
  the simulator and the replay, through ``device.driver.drive``). The policy's calls inside
  the step then read one value, the live count of the caps; the step's expansion count, which
  the ledger records, is read in ``observe``, after verification;
- behind the packed interface (``begin_step`` / ``after_depth`` / ``select``, for a caller of
  ``echo_scheduler.driver.drive_step``): each drafted depth is converted to a slab here
  (:func:`~echo_scheduler.device.packed.depth_slab`) and the count of nodes to expand read
  once per depth for the packed drafter, as ``echo`` does.
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_gating.policy import GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.device.echo_step import FixedEchoStep, StepPrices, StepScalars, layout_rows
from echo_scheduler.device.layout import DepthSlab, Frontier
from echo_scheduler.device.packed import frontier_nodes, new_depth_slab, packed_keep
from echo_scheduler.errors import PolicyError
from echo_scheduler.interface import DraftPlan, StepBatch, StepOutcome
from echo_scheduler.policies.echo import EchoPolicy
from echo_scheduler.policies.frontier import expand_all


class DeviceEchoPolicy(EchoPolicy):
    """ECHO with its per-depth decisions and selection made by
    :class:`~echo_scheduler.device.echo_step.FixedEchoStep` (module docstring)."""

    def __init__(
        self, config: PolicyConfig, gate: GatePolicy | None = None, name: str = "echo_device"
    ) -> None:
        super().__init__(config, gate, name=name)
        self.fixed: FixedEchoStep | None = None
        self._locals: list[Tensor] = []  # per drafted depth: [B, n_d] local index, -1 invalid
        self._drafted: TreeBatch | None = None  # the last pool this step drafted
        self._expanded_t: Tensor | None = None  # expansions of a fixed-driven step (device)
        self._caps_cache: tuple[tuple[str, tuple[int, ...]], Tensor] | None = None
        self._scalars: StepScalars | None = None  # the steps' price buffers, refilled per step

    def _start(self, batch: StepBatch) -> None:
        super()._start(batch)
        self.fixed, self._locals, self._drafted = None, [], None

    # -- driven in the fixed layout by the caller (a drafter that drafts [B, n_d] slabs) ------

    def begin_fixed(self, batch: StepBatch, device: torch.device | None = None) -> int:
        """Begin a step whose depths the caller drafts as slabs on ``device`` (default: that of
        ``batch.max_nodes``): the width of every live root (0: the step is not drafted; else
        depth 1's slab holds the roots' first ``width`` children). The host decisions of
        ``begin_step`` (pre-check, exploration, mode) read ``batch.max_nodes``, so caps kept on
        the host make the step sync-free; their device copy is made once per distinct caps."""
        self._batch, self.depth = batch, 0
        self._start(batch)
        self._expanded_t = None
        width = 0 if batch.budget == 0 or batch.batch_size == 0 else self._root_width(batch)
        if width:
            caps = self._device_caps(batch.max_nodes, device or batch.max_nodes.device)
            self.fixed = self._new_step(caps)
        return width

    def _device_caps(self, caps: Tensor, device: torch.device) -> Tensor:
        """``caps`` on ``device``: itself when it is there; else, for caps all equal (the
        plugin's ``N - 1``), a fill on the device (no copy from the host, whatever B); else a
        copy from pinned memory, cached by value (a host tensor's values are read for free)."""
        if caps.device == device:
            return caps
        values = tuple(caps.tolist())
        if len(set(values)) <= 1:
            fill = values[0] if values else 0
            return torch.full((len(values),), fill, dtype=torch.int64, device=device)
        key = (str(device), values)
        if self._caps_cache is None or self._caps_cache[0] != key:
            pinned = caps.pin_memory() if torch.cuda.is_available() else caps
            self._caps_cache = (key, pinned.to(device, non_blocking=True))
        return self._caps_cache[1]

    def fixed_depths(self, available: int) -> int:
        """How many of the caller's ``available`` drafted depths this step folds in: 1 when it
        drafts depth 1 only (the shallow mode, exploring), else up to ``config.max_depth``."""
        if self.fixed is None:
            return 0
        return min(available, 1 if self._shallow else self.config.max_depth)

    def fixed_depth(self, slab: DepthSlab, last: bool, gate_empty: bool = True) -> Frontier:
        """Fold in the next drafted depth (:meth:`FixedEchoStep.fold_depth`); its expansions
        are counted on the device and read by :meth:`observe`."""
        fixed = self.fixed
        if fixed is None:
            raise PolicyError(f"{self.name}: fixed_depth outside a drafted begin_fixed step")
        front = fixed.fold_depth(slab, last, gate_empty)  # the deepest depth expands nothing
        self.truncated_at = fixed.truncated_at
        count = front.expand.sum()
        self._expanded_t = count if self._expanded_t is None else self._expanded_t + count
        return front

    def fixed_select(self) -> Tensor:
        """The selection over every folded slab: [B, S] bool (no host sync)."""
        if self.fixed is None:
            raise PolicyError(f"{self.name}: fixed_select outside a drafted begin_fixed step")
        return self.fixed.select()

    def observe(self, outcome: StepOutcome) -> None:
        if self._expanded_t is not None:  # after verification: the reads cost no stall
            self._expanded += int(self._expanded_t)
            self._expanded_t = None
            if self.fixed is not None:  # the drafter calls a packed driver would have made
                self.depth = int(self.fixed.drafted_depths)
        super().observe(outcome)

    def _new_step(self, caps: Tensor) -> FixedEchoStep:
        """This step's :class:`FixedEchoStep` over ``caps`` (on the step's device). Its price
        buffers are the policy's own, refilled each step (fresh ones only on a new device, or
        for a batch larger than their latency table covers), as one captured graph would hold
        them."""
        prices = self._prices(caps)
        rows = layout_rows(self.config, int(caps.shape[0]))
        held = self._scalars
        if held is None or held.budget.device != caps.device or held.latency.numel() <= rows:
            held = self._scalars = StepScalars.of(prices, caps.device, rows)
        else:
            held.load(prices)
        return FixedEchoStep(self.config, self._step_gate, prices, held)

    def _prices(self, caps: Tensor) -> StepPrices:
        batch = self.batch
        return StepPrices(
            budget=batch.budget,
            caps=caps,
            min_utility=batch.min_utility,
            node_price=batch.node_price or 0.0,
            depth_price=self._depth_price(),
            row_price=batch.row_price,
            explore_rows=batch.explore_rows if self._exploring else 0,
        )

    def _next_plan(self, pool: TreeBatch) -> DraftPlan:
        d = self.depth
        if d == 1:
            self.fixed = self._new_step(self.batch.max_nodes)
        fixed = self.fixed
        if fixed is None or fixed.depth != d - 1 or (self._drafted is None and d > 1):
            raise PolicyError(f"{self.name}: depth {d} of a step whose depth 1 it did not see")
        before = self._drafted
        front = None if before is None else (self._locals[-1], fixed.fronts[-1])
        drafted = 0 if before is None else before.num_nodes
        slab, local = new_depth_slab(pool, drafted, d, self.config.draft_width, front)
        self._locals.append(local)
        self._drafted = pool
        last = self._shallow or d >= self.config.max_depth
        chosen = fixed.fold_depth(slab, last)
        self.truncated_at = fixed.truncated_at
        if last:
            return DraftPlan.finished(pool.device)
        nodes = frontier_nodes(pool, local, chosen)  # the packed drafter sizes its call by it
        if nodes.numel() == 0:
            return DraftPlan.finished(pool.device)
        self._expanded += int(nodes.numel())
        return expand_all(nodes, self.config.draft_width)

    def select(self, pool: TreeBatch) -> Tensor:
        fixed = self.fixed
        if fixed is None or pool is not self._drafted:
            return super().select(pool)  # a pool this step did not draft: the host reference
        return packed_keep(pool, torch.cat(self._locals, dim=1), fixed.select())
