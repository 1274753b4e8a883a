"""echo-controller: the budget controller of a multi-node ECHO deployment.

It splits each pool's global verify budget across the serving nodes by water-filling on their
marginal-utility curves and hands the splits out as leases (:mod:`.lease_table`, the split and
its invariant; :mod:`.water_fill`, the formula; :mod:`.service`, the gRPC service;
:mod:`.process`, the ``echo-controller`` process). It needs no torch and no model code: the
one optional feature that does, calibration sharing (:mod:`.calibration`), loads echo-gating
only when it is enabled.

Serving nodes (echo-server) import its torch-free gRPC helpers: :mod:`.server` (grpc.aio server
with health, reflection, auth, limits), :mod:`.security` (TLS, bearer tokens), :mod:`.errors`,
the budget-protocol conversions of :mod:`.convert`, :mod:`.metrics` and :mod:`.logs`.
"""

__version__ = "0.1.0"
