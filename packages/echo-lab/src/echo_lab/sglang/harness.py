"""Start and stop a real SGLang server on the CPU (package docstring), and query it.

Every mode serves the same float32 model with SGLang's CPU kernels (``--attention-backend
intel_amx``: on a CPU without AMX, ``ECHO_SGL_KERNEL_FORCE_CPU_BACKEND=1`` makes SGLang take that
path with echo-sgl-kernel-cpu's torch ops, packages/echo-sgl-kernel). The speculative modes draft
with ECHO's shipped head exported as an SGLang draft (``.cache/sglang-head``) and the same tree
limits (``TREE``): EAGLE-3 verifies SGLang's fixed top-k tree, ECHO its own selection within it
(``echo``: the packed policy driver; ``echo_device``: the same decisions and encoding in the fixed
layout, with no host sync, echo_sglang.fixed_replay).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[5]
CACHE = REPO / ".cache"
MODES = ("plain", "eagle3", "echo", "echo_device")
TREE = {"steps": 4, "topk": 4, "draft_tokens": 8}
"""Draft depth, children per node and padded verify width (N) of both speculative modes."""
FORCE_CPU_BACKEND = "ECHO_SGL_KERNEL_FORCE_CPU_BACKEND"


class HarnessError(RuntimeError):
    """The SGLang environment is missing, or a server failed to start or answer."""


@dataclass(frozen=True, slots=True)
class Environment:
    """Where ``scripts/sglang/setup_env.sh`` put the venv, the model and the head."""

    python: Path
    model: Path
    head: Path
    gate: Path | None = None

    @classmethod
    def default(cls) -> Environment:
        venv = Path(os.environ.get("ECHO_SGLANG_VENV", CACHE / "sglang-venv"))
        gate = REPO / "packages/echo-server/src/echo_server/assets/smollm2-135m-eagle.gate.json"
        return cls(venv / "bin" / "python", CACHE / "sglang-model", CACHE / "sglang-head", gate)

    def problem(self) -> str | None:
        """What is missing, or None when the environment is complete."""
        for what, path in (("venv", self.python), ("model", self.model / "config.json"),
                           ("head", self.head / "config.json")):  # fmt: skip
            if not path.exists():
                return f"SGLang {what} missing ({path}): run bash scripts/sglang/setup_env.sh"
        return None


def server_command(env: Environment, mode: str, port: int, extra: Sequence[str] = ()) -> list[str]:
    """The ``sglang.launch_server`` command line of ``mode`` (module docstring)."""
    if mode not in MODES:
        raise HarnessError(f"mode must be one of {MODES}, got {mode!r}")
    cmd = [
        str(env.python), "-m", "sglang.launch_server", "--model-path", str(env.model),
        "--device", "cpu", "--dtype", "float32", "--attention-backend", "intel_amx",
        "--disable-cuda-graph", "--disable-overlap-schedule", "--grammar-backend", "none",
        "--max-total-tokens", "8192", "--max-running-requests", "8", "--page-size", "1",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "info",
    ]  # fmt: skip
    if mode != "plain":
        cmd += [
            "--speculative-algorithm", "EAGLE3" if mode == "eagle3" else "ECHO",
            "--speculative-draft-model-path", str(env.head),
            "--speculative-num-steps", str(TREE["steps"]),
            "--speculative-eagle-topk", str(TREE["topk"]),
            "--speculative-num-draft-tokens", str(TREE["draft_tokens"]),
        ]  # fmt: skip
    if mode in ("echo", "echo_device"):
        cmd += ["--speculative-echo-draft-algorithm", "EAGLE3"]
        if env.gate is not None:
            cmd += ["--speculative-echo-gate-file", str(env.gate)]
    if mode in ("echo", "echo_device"):  # the packed driver, or the fixed layout (no sync)
        cmd += ["--speculative-echo-policy", mode]
    return [*cmd, *extra]


def server_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The process environment of a CPU server: SGLang's CPU engine, the forced kernel path,
    then ``extra``."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env.update({"SGLANG_USE_CPU_ENGINE": "1", FORCE_CPU_BACKEND: "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """One running ``sglang.launch_server`` process (its own process group) and its log."""

    mode: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    _closed: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, path: str, body: dict[str, Any], timeout: float = 600.0) -> tuple[int, Any]:
        """POST JSON; (status, parsed body) for 2xx and 4xx/5xx alike."""
        req = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return int(resp.status), json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return int(exc.code), json.loads(raw or b"null")
            except json.JSONDecodeError:
                return int(exc.code), raw.decode(errors="replace")

    def generate(self, input_ids: Sequence[int], max_new_tokens: int) -> dict[str, Any]:
        """Greedy continuation of ``input_ids`` through SGLang's native ``/generate``."""
        status, body = self.post("/generate", {
            "input_ids": list(input_ids),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens},
        })  # fmt: skip
        if status != 200 or not isinstance(body, dict):
            raise HarnessError(f"{self.mode} server: /generate -> {status}: {body}")
        return body

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def pause(self) -> None:
        """Stop every process of the server (SIGSTOP). SGLang's idle scheduler polls without
        sleeping, a core's worth of CPU per idle server: on a small CPU, servers that are not
        being measured or queried must be paused."""
        if self.alive():
            os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Continue a paused server (SIGCONT)."""
        if self.alive():
            os.killpg(self.process.pid, signal.SIGCONT)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.alive():
            os.killpg(self.process.pid, signal.SIGCONT)
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


def start_server(
    env: Environment,
    mode: str,
    log_dir: Path,
    extra: Sequence[str] = (),
    timeout_s: float = 600.0,
    extra_env: Mapping[str, str] | None = None,
) -> Server:
    """Start ``mode`` and wait until it answers a one-token ``/generate``; HarnessError with the
    log's tail if the process exits or the deadline passes first."""
    problem = env.problem()
    if problem is not None:
        raise HarnessError(problem)
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"sglang-{mode}-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            server_command(env, mode, port, extra), stdout=out, stderr=subprocess.STDOUT,
            env=server_env(extra_env), cwd=REPO, start_new_session=True,
        )  # fmt: skip
    server = Server(mode, port, process, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.alive():
            raise HarnessError(f"{mode} server exited ({process.returncode}):\n{_tail(server)}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    server.generate([1, 2, 3], 1)
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError, HarnessError):
            pass
        time.sleep(2.0)
    server.close()
    raise HarnessError(f"{mode} server not ready after {timeout_s:.0f} s:\n{_tail(server)}")


def _tail(server: Server, lines: int = 40) -> str:
    return "\n".join(server.log_text().splitlines()[-lines:])
