"""``echo-sd serve``: one serving node: the generation API over gRPC (and, with
``--http-listen``, the OpenAI-compatible HTTP API beside it), following a controller.

Example (a node of pool ``dp`` that takes its budget from a controller on port 7000)::

    echo-sd serve --listen 127.0.0.1:7001 --node-id n1 --pool dp \\
        --controller 127.0.0.1:7000 --metrics-listen 127.0.0.1:9101 --budget 16
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from echo_controller.cli import add_server_options, run_until_signalled, server_config
from echo_controller.security import ClientTls, read_token
from echo_server.cli.options import POLICY_CHOICES, add_engine_options, build_engine, load
from echo_server.engine.profile import PROFILE_TOKENS
from echo_server.grpc.convert import RequestLimits
from echo_server.grpc.lease import NodeIdentity
from echo_server.grpc.node import NodeConfig, serve_node


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve the generation API over gRPC and/or HTTP (one node)")
    p.add_argument(
        "--node-id", default=None, help="unique node id (default: hostname/host:bound port)"
    )
    p.add_argument("--policy", choices=POLICY_CHOICES, default="echo")
    p.add_argument("--max-waiting", type=int, default=32, help="queue beyond the batch")
    p.add_argument("--default-max-tokens", type=int, default=128)
    p.add_argument("--max-tokens-limit", type=int, default=2048)
    p.add_argument("--grace-s", type=float, default=10.0, help="shutdown grace period")
    add_server_options(p, "127.0.0.1:50051")
    h = p.add_argument_group("OpenAI-compatible HTTP API (same engine, token and TLS as gRPC)")
    h.add_argument("--http-listen", default=None, help="host:port of the HTTP API (default: off)")
    h.add_argument("--no-grpc", action="store_true", help="serve only the HTTP API")
    h.add_argument("--served-model-name", default=None, help="model id (default: the model's)")
    c = p.add_argument_group("budget controller")
    c.add_argument("--controller", default=None, help="host:port of the budget controller")
    c.add_argument("--pool", default="", help="nodes of one pool share its global budget")
    c.add_argument("--controller-ca", type=Path, default=None, help="CA of the controller (TLS)")
    c.add_argument("--controller-cert", type=Path, default=None, help="client cert (mTLS)")
    c.add_argument("--controller-key", type=Path, default=None, help="client key (mTLS)")
    c.add_argument("--controller-token-file", type=Path, default=None)
    add_engine_options(p)


def run(args: argparse.Namespace) -> int:
    if args.no_grpc and not args.http_listen:
        raise SystemExit("echo-sd serve: --no-grpc needs --http-listen")
    loaded = load(args)
    engine = build_engine(loaded, args.policy, args)
    cost = engine.budget.local.cost
    identity = NodeIdentity(
        node_id=args.node_id or "",  # "": from the bound port (grpc.node_identity)
        k_max=engine.budget.local_k(1),
        pool=args.pool,
        target=loaded.source.name,
        drafter=engine.drafter.name,
        verify_cost=tuple((t, cost.latency_at(t) * 1000) for t in PROFILE_TOKENS) if cost else (),
    )
    limits = RequestLimits(
        vocab_size=loaded.model.config.vocab_size,
        policy=engine.policy.name,
        default_max_tokens=args.default_max_tokens,
        max_tokens=args.max_tokens_limit,
    )
    controller_tls = (
        ClientTls(args.controller_ca, args.controller_cert, args.controller_key)
        if args.controller_ca
        else None
    )
    config = NodeConfig(
        server=server_config(args),
        limits=limits,
        max_waiting=args.max_waiting,
        grace_s=args.grace_s,
        metrics_listen=args.metrics_listen,
        ready_file=args.ready_file,
        controller=args.controller,
        controller_tls=controller_tls,
        controller_token=read_token(args.controller_token_file),
        grpc=not args.no_grpc,
        http_listen=args.http_listen,
        model_name=args.served_model_name or loaded.source.name,
    )
    return asyncio.run(run_until_signalled(lambda stop: serve_node(engine, identity, config, stop)))
