"""ECHO's scheduler in a fixed layout: decisions as tensor ops with no host sync (issue #44).

- :mod:`~echo_scheduler.device.layout`: the [B, n_d] slab per drafted depth, the padded
  frontier, the gate signals in that layout;
- :mod:`~echo_scheduler.device.echo_step`: :class:`FixedEchoStep`, ECHO's per-depth decisions
  and selection over the slabs;
- :mod:`~echo_scheduler.device.adapter`: policy ``echo_device``, behind the packed drivers (each
  depth's pool converted to a slab, the frontier and selection back) or driven in slabs;
- :mod:`~echo_scheduler.device.driver`: the step loop for drafters that draft slabs.
"""

from echo_scheduler.device.echo_step import FixedEchoStep, StepPrices
from echo_scheduler.device.layout import DepthSlab, Frontier

__all__ = ["DepthSlab", "FixedEchoStep", "Frontier", "StepPrices"]
