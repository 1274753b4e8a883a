"""A controller host needs no torch and no model code: echo-controller never imports them.

A fresh interpreter where ``import torch`` and every torch-based ECHO package (echo-server
included) raise imports every module of ``echo_controller``, runs a controller over gRPC and
checks a water-filling grant; only the optional calibration pool may fail, and its loader then
says what to install. A static pass over the sources catches imports inside functions, which
importing the modules does not run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import echo_controller

BLOCKED = ("torch", "echo_server", "echo_core", "echo_gating", "echo_scheduler", "echo_kernels")
OPTIONAL = "echo_controller.calibration_pool"  # the calibration-sharing extra: echo-gating
SOURCES = Path(echo_controller.__file__).resolve().parent

SCRIPT = textwrap.dedent(
    """
    import asyncio
    import importlib
    import importlib.abc
    import pkgutil
    import sys

    BLOCKED, OPTIONAL = sys.argv[1].split(","), sys.argv[2]


    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"echo-controller must not import {name}")
            return None


    sys.meta_path.insert(0, Block())

    import echo_controller

    failed = {}
    names = []
    for info in pkgutil.walk_packages(echo_controller.__path__, "echo_controller."):
        names.append(info.name)
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            failed[info.name] = str(exc)
    assert set(failed) == {OPTIONAL}, failed
    assert "must not import torch" in failed[OPTIONAL], failed
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked

    from echo_controller import cli
    from echo_controller.calibration import (
        CalibrationUnavailableError,
        PoolConfig,
        calibration_pool,
    )
    from echo_controller.lease_table import LeaseConfig
    from echo_controller.process import ControllerConfig, start_controller
    from echo_controller.server import ServerConfig

    try:
        calibration_pool(PoolConfig())
        raise AssertionError("the calibration pool loaded without echo-gating")
    except CalibrationUnavailableError as exc:
        assert "install echo-gating to pool calibration records" in str(exc), exc
    try:
        cli.main(["--global-budget", "6", "--listen", "127.0.0.1:0"])
        raise AssertionError("the controller started calibration sharing without echo-gating")
    except SystemExit as exc:
        assert "--no-calibration" in str(exc.code), exc.code
    args = cli.build_parser().parse_args(["--global-budget", "6", "--no-calibration"])
    assert args.no_calibration


    async def grant():
        import grpc

        from echo_proto.budget.v1 import budget_pb2 as bpb
        from echo_proto.budget.v1 import budget_pb2_grpc

        lease = LeaseConfig(global_budget=6, ttl_ms=5000, report_interval_ms=1000)
        config = ControllerConfig(ServerConfig("127.0.0.1:0"), lease, calibration=None)
        running = await start_controller(config, incarnation=1, quarantine=False)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{running.server.port}") as ch:
                stub = budget_pb2_grpc.BudgetControllerStub(ch)
                regs = {}
                for node in ("a", "b"):
                    request = bpb.RegisterNodeRequest(node_id=node, pool="dp", k_max=4)
                    regs[node] = (await stub.RegisterNode(request, timeout=10)).registration_epoch
                table = running.service.table
                assert {n: table.current(n).budget_k for n in regs} == {"a": 3, "b": 2}
                busy = bpb.MarginalUtility(budget_step=1, accepted_per_token=[0.9, 0.8, 0.7, 0.6])
                report = bpb.ReportRequest(
                    node_id="a",
                    registration_epoch=regs["a"],
                    lease_epoch=table.current("a").epoch,
                    utility=busy,
                )
                await stub.Report(report, timeout=10)
                # water-filling: a's utility takes its k_max, idle b keeps what is left
                return {n: table.current(n).budget_k for n in regs}
        finally:
            await running.stop()


    budgets = asyncio.run(grant())
    assert budgets == {"a": 4, "b": 2}, budgets
    print("OK", len(names), "modules", budgets)
    """
)


def test_every_module_imports_and_a_controller_grants_without_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(BLOCKED), OPTIONAL],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.startswith("OK "), result.stdout


class _Imports(ast.NodeVisitor):
    """(line, module) of every absolute import outside ``if TYPE_CHECKING:`` blocks."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []

    def visit_If(self, node: ast.If) -> None:
        if ast.unparse(node.test) == "TYPE_CHECKING":  # annotations only: never run
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found += [(node.lineno, alias.name) for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and not node.level:
            self.found.append((node.lineno, node.module))


def test_no_source_imports_torch_or_model_code_even_inside_functions() -> None:
    found = []
    for path in sorted(SOURCES.glob("*.py")):
        if path.stem == OPTIONAL.rpartition(".")[2]:
            continue
        imports = _Imports()
        imports.visit(ast.parse(path.read_text(encoding="utf-8")))
        for line, module in imports.found:
            if module.split(".")[0] in BLOCKED:
                found.append(f"{path.name}:{line}: {module}")

    assert not found
