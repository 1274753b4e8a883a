"""The default node id: ``<hostname>/<host>:<bound port>``, unique by construction.

Two processes cannot hold one port of one host at once (servers bind without SO_REUSEPORT), so
an id built from the *bound* port (not the ``--listen`` text, whose port may be 0) differs
between any two live nodes of a host, and hostnames tell hosts apart. A node restarted on the
same port reuses its id, which is what the controller expects of a restart (the new
registration replaces the old one). ``--node-id`` overrides it.
"""

from __future__ import annotations

import re
import socket

from echo_controller.convert import NODE_ID

_DISALLOWED = re.compile(r"[^A-Za-z0-9._:/@-]")


def bound_node_id(listen: str, port: int, hostname: str | None = None) -> str:
    """``<hostname>/<listen host>:<port>``, with characters a node id may not hold replaced by
    ``-`` (IPv6 brackets, for one) and cut to the 128 a node id may have.

    Example: ``bound_node_id("127.0.0.1:0", 40123, "gpu-3")`` is ``"gpu-3/127.0.0.1:40123"``.
    """
    if port <= 0:
        raise ValueError(f"a bound port is > 0, got {port}")
    host = listen.rpartition(":")[0] or "0.0.0.0"
    name = hostname if hostname is not None else socket.gethostname()
    head = _DISALLOWED.sub("-", f"{name}/{host}").lstrip("-._:/@") or "node"
    suffix = f":{port}"  # the unique part: kept whole when a long hostname is cut
    node_id = head[: 128 - len(suffix)] + suffix
    if not NODE_ID.fullmatch(node_id):
        raise ValueError(f"cannot build a node id from {listen!r} and port {port}: {node_id!r}")
    return node_id
