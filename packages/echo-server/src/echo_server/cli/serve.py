"""``echo-sd serve``: one serving node: the generation API over gRPC (and, with
``--http-listen``, the OpenAI-compatible HTTP API beside it), following a controller.

:func:`serve_node` assembles the process: the transport-free :class:`~echo_server.node.node.Node`
(engine thread, drift observer, metrics), the gRPC lease client as its follower, and the
listeners (gRPC, HTTP, metrics). Shutdown (SIGTERM / SIGINT): health turns NOT_SERVING, new
requests get UNAVAILABLE, in-flight requests may finish within ``grace_s`` and are cancelled
after it (their clients see FINISH_REASON_ABORTED); the lease is released (Deregister) and the
servers stop.

Example (a node of pool ``dp`` that takes its budget from a controller on port 7000)::

    echo-sd serve --listen 127.0.0.1:7001 --node-id n1 --pool dp \\
        --controller 127.0.0.1:7000 --metrics-listen 127.0.0.1:9101 --budget 16
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from echo_controller.cli import add_server_options, run_until_signalled, server_config
from echo_controller.security import ClientTls, read_token
from echo_controller.server import ServerConfig, start_metrics, start_server, write_ready_file
from echo_proto.serving.v1 import serving_pb2_grpc
from echo_server.cli.options import POLICY_CHOICES, add_engine_options, build_engine, load
from echo_server.engine import Engine
from echo_server.engine.profile import PROFILE_TOKENS
from echo_server.grpc.generation_service import SERVICE_NAME, GenerationService
from echo_server.grpc.lease_client import LeaseClient
from echo_server.http.app import HttpState, create_app
from echo_server.http.server import HttpServer
from echo_server.node.identity import bound_node_id
from echo_server.node.lease import NodeIdentity
from echo_server.node.limits import RequestLimits
from echo_server.node.node import Node

log = structlog.get_logger(__name__)


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
        node_id=args.node_id or "",  # "": from the bound port (node/identity.py)
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


@dataclass(frozen=True, slots=True)
class NodeConfig:
    server: ServerConfig
    limits: RequestLimits
    max_waiting: int = 32
    grace_s: float = 10.0
    metrics_listen: str | None = None
    ready_file: Path | None = None
    controller: str | None = None  # host:port of the budget controller; None = standalone
    controller_tls: ClientTls | None = None
    controller_token: str | None = None
    observe_interval_s: float = 1.0  # how often the gate observer reads the engine's records
    window_s: float = 10.0
    grpc: bool = True  # serve the gRPC generation API on server.listen
    http_listen: str | None = None  # host:port of the OpenAI-compatible HTTP API; None = off
    model_name: str = "echo"  # the model id the HTTP API serves (GET /v1/models)


async def serve_node(
    engine: Engine, identity: NodeIdentity, config: NodeConfig, stop: asyncio.Event
) -> None:
    """Serve until ``stop`` is set, then shut down gracefully (module docstring)."""
    node = Node(
        engine,
        identity,
        max_waiting=config.max_waiting,
        window_s=config.window_s,
        observe_interval_s=config.observe_interval_s,
    )
    await node.start()
    worker, metrics = node.worker, node.metrics
    client = (
        LeaseClient(
            config.controller,
            identity,
            worker,
            node.observer,
            tls=config.controller_tls,
            token=config.controller_token,
            metrics=metrics,
        )
        if config.controller
        else None
    )
    if client is not None:
        node.follow(client)
    service = GenerationService(worker, config.limits, identity.node_id, node.lease, metrics)
    server = (
        await start_server(
            config.server,
            lambda s: serving_pb2_grpc.add_GenerationServiceServicer_to_server(service, s),
            [SERVICE_NAME],
            on_refused=lambda code: metrics.refused.labels(code).inc(),
        )
        if config.grpc
        else None
    )
    http_state = HttpState(
        worker,
        config.limits,
        config.model_name,
        metrics,
        token=config.server.token,
        max_body_bytes=config.server.max_message_bytes,
    )
    web = (
        await HttpServer.start(create_app(http_state), config.http_listen, config.server.tls)
        if config.http_listen
        else None
    )
    http_state.serving = True
    if not identity.node_id:  # from the bound port: unique by construction (node/identity.py)
        port = server.port if server else web.port if web else 0
        listen = config.server.listen if server else config.http_listen or ""
        node.set_node_id(bound_node_id(listen, port))
        service.node_id = node.identity.node_id
    http = start_metrics(metrics.registry, config.metrics_listen, config.server)
    node.run_background()
    ports = {
        "grpc_port": server.port if server else 0,
        "http_port": web.port if web else 0,
        "metrics_port": http.server_port if http else 0,
        "health_port": server.health_port if server else 0,
    }
    if config.ready_file is not None:
        write_ready_file(config.ready_file, **ports)
    log.info("node_serving", node_id=node.identity.node_id, controller=config.controller, **ports)
    try:
        await stop.wait()
    finally:
        log.info("node_draining", in_flight=worker.in_flight, grace_s=config.grace_s)
        http_state.serving = False
        if server is not None:
            await server.set_serving(False)
        cancelled = await node.drain(config.grace_s)
        if server is not None:
            await server.stop(1.0)
        if web is not None:
            await web.stop()
        await node.close()
        if http is not None:
            http.shutdown()
        log.info("node_stopped", cancelled=cancelled)
