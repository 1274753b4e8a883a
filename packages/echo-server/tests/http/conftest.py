"""A real serving node (``serve_node``: gRPC and the HTTP API on one engine thread) on loopback
ports, running its own event loop in a background thread so that synchronous clients (the
official ``openai`` SDK, ``httpx``) can call it from the test."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from echo_controller.server import ServerConfig
from echo_scheduler.policies import make_policy
from echo_server.cli.serve import NodeConfig, serve_node
from echo_server.drafting import NgramDrafter
from echo_server.engine import Engine, EngineConfig
from echo_server.model.loader import LoadedModel
from echo_server.node.lease import NodeIdentity
from echo_server.node.limits import RequestLimits

MODEL = "smollm2-test"
START_TIMEOUT_S = 60.0


@dataclass
class LiveNode:
    http_url: str  # http://127.0.0.1:PORT
    grpc_target: str  # 127.0.0.1:PORT
    loop: asyncio.AbstractEventLoop
    stop: asyncio.Event
    engine: Engine  # touched by the node's engine thread only, unless a test pauses it

    def begin_shutdown(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)


LiveNodeFactory = Callable[..., AbstractContextManager[LiveNode]]


@pytest.fixture
def live_node(smollm: LoadedModel, tmp_path: Path) -> LiveNodeFactory:
    @contextmanager
    def start(
        *,
        policy: str = "echo",
        token: str | None = None,
        max_batch: int = 2,
        max_waiting: int = 4,
        grace_s: float = 5.0,
        max_body_bytes: int = 4 * 1024 * 1024,
    ) -> Iterator[LiveNode]:
        engine = Engine(
            smollm.model,
            smollm.tokenizer,
            make_policy(policy),
            NgramDrafter(),
            EngineConfig(budget=8, max_batch=max_batch, kv_slots=2048),
        )
        ready = tmp_path / f"ready-{id(engine)}.json"
        config = NodeConfig(
            server=ServerConfig("127.0.0.1:0", token=token, max_message_bytes=max_body_bytes),
            limits=RequestLimits(vocab_size=smollm.model.config.vocab_size, policy=policy),
            max_waiting=max_waiting,
            grace_s=grace_s,
            ready_file=ready,
            http_listen="127.0.0.1:0",
            model_name=MODEL,
        )
        identity = NodeIdentity(node_id="http-test", k_max=8, target=MODEL, drafter="ngram")
        started = threading.Event()
        box: dict[str, object] = {}

        def main() -> None:
            async def run() -> None:
                stop = asyncio.Event()
                box["loop"], box["stop"] = asyncio.get_running_loop(), stop
                started.set()
                await serve_node(engine, identity, config, stop)

            try:
                asyncio.run(run())
            except BaseException as exc:  # reported to the test thread below
                box["error"] = exc
                started.set()

        thread = threading.Thread(target=main, name="live-node", daemon=True)
        thread.start()
        assert started.wait(START_TIMEOUT_S)
        waited = 0.0
        while not ready.exists() and "error" not in box and waited < START_TIMEOUT_S:
            threading.Event().wait(0.02)
            waited += 0.02
        if "error" in box:
            raise AssertionError(f"the node failed to start: {box['error']!r}")
        ports = json.loads(ready.read_text())
        loop, stop = box["loop"], box["stop"]
        assert isinstance(loop, asyncio.AbstractEventLoop)
        assert isinstance(stop, asyncio.Event)
        node = LiveNode(
            f"http://127.0.0.1:{ports['http_port']}",
            f"127.0.0.1:{ports['grpc_port']}",
            loop,
            stop,
            engine,
        )
        try:
            yield node
        finally:
            node.begin_shutdown()
            thread.join(START_TIMEOUT_S)
            assert not thread.is_alive(), "the node did not shut down"
            assert "error" not in box, f"the node failed: {box.get('error')!r}"

    return start
