"""ECHO's scheduler in a fixed layout: decisions as tensor ops with no host sync (issue #44).

- :mod:`~echo_scheduler.device.layout`: the [B, n_d] slab per drafted depth, the padded
  frontier, the gate signals in that layout;
- :mod:`~echo_scheduler.device.echo_step`: :class:`FixedEchoStep`, ECHO's per-depth decisions
  and selection over the slabs;
- :mod:`~echo_scheduler.device.adapter`: the packed pools the drivers grow, converted to slabs
  and back (policy ``echo_device``).
"""

from echo_scheduler.device.echo_step import FixedEchoStep, StepPrices
from echo_scheduler.device.layout import DepthSlab, Frontier

__all__ = ["DepthSlab", "FixedEchoStep", "Frontier", "StepPrices"]
