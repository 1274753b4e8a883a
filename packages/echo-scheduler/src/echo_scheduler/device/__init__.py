"""ECHO's scheduler in a fixed layout: decisions as tensor ops with no host sync (issue #44).

- :mod:`~echo_scheduler.device.layout`: the [B, n_d] slab per drafted depth, the padded
  frontier, the gate signals in that layout;
- :mod:`~echo_scheduler.device.echo_step`: :class:`FixedEchoStep`, ECHO's per-depth decisions
  and selection over the slabs;
- :mod:`~echo_scheduler.device.adapter`: policy ``echo_device``, driven in slabs or behind the
  packed interface;
- :mod:`~echo_scheduler.device.packed`: packed pools as slabs and back, a packed draft source
  as a slab source;
- :mod:`~echo_scheduler.device.driver`: the fixed layout's step loop, and ``drive``, the one
  entry for every packed caller (the fixed loop for ``echo_device``, ``drive_step`` else).
"""

from echo_scheduler.device.echo_step import FixedEchoStep, StepPrices, StepScalars
from echo_scheduler.device.layout import DepthSlab, Frontier

__all__ = ["DepthSlab", "FixedEchoStep", "Frontier", "StepPrices", "StepScalars"]
