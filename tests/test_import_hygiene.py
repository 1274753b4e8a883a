"""Import hygiene across the workspace, from the source alone (nothing is imported).

- Test fixtures stay out of production: a module named ``testing`` (``echo_kernels.testing``,
  ``echo_gating.testing``, ...) holds test and benchmark fixtures, and no other module of any
  package under ``packages/*/src`` imports one.
- The product never imports the lab: no module outside ``echo_lab`` imports ``echo_lab``, and the
  serving packages hold no benchmark, replay or training module.
- echo_server's layers point one way: ``model`` (the runner) never imports ``kv`` (the slot pool
  built on it), and the imports between ``model``, ``kv``, ``drafting`` and ``engine`` have no
  cycle (today: engine -> drafting, kv, model; kv -> model; drafting -> model).
- The serving node is transport-free: ``echo_server.node`` imports neither adapter
  (``echo_server.grpc``, ``echo_server.http``), the gRPC adapter never imports the HTTP one, and
  only the CLI (``echo-sd serve`` assembles the process) imports both.

Modules are listed with :func:`pkgutil.iter_modules` over each ``src`` tree and their imports read
with :mod:`ast` (every ``import`` statement, also inside functions and ``TYPE_CHECKING`` blocks).
"""

from __future__ import annotations

import ast
import pkgutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY_PREFIX = "echo_"


@dataclass(frozen=True, slots=True)
class Module:
    name: str  # dotted, e.g. "echo_server.kv.pool"
    path: Path
    is_package: bool


def walk(directory: Path, prefix: str) -> Iterator[Module]:
    """Every module under the package directory ``directory`` (named ``prefix``), recursively."""
    yield Module(prefix, directory / "__init__.py", True)
    for info in pkgutil.iter_modules([str(directory)]):
        name = f"{prefix}.{info.name}"
        if info.ispkg:
            yield from walk(directory / info.name, name)
        else:
            yield Module(name, directory / f"{info.name}.py", False)


def source_modules() -> list[Module]:
    """Every module of every first-party package in ``packages/*/src``."""
    found: list[Module] = []
    for src in sorted(ROOT.glob("packages/*/src")):
        for info in pkgutil.iter_modules([str(src)]):
            if info.ispkg and info.name.startswith(FIRST_PARTY_PREFIX):
                found.extend(walk(src / info.name, info.name))
    return found


def imported_names(module: Module) -> set[str]:
    """Dotted names ``module`` imports: ``from a.b import c`` gives ``a.b`` and ``a.b.c`` (c may
    be a submodule); relative imports are resolved against the module's package."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def is_testing(name: str) -> bool:
    return "testing" in name.split(".")


MODULES = source_modules()
IMPORTS = {m.name: imported_names(m) for m in MODULES}


def test_the_walk_sees_the_packages_and_their_fixture_modules() -> None:
    names = set(IMPORTS)
    assert {"echo_core.tree", "echo_server.kv.pool", "echo_server.model.llama"} <= names
    assert {"echo_kernels.testing", "echo_gating.testing"} <= names
    assert "echo_scheduler.workloads" in names  # the lab's comparison and traces import it
    assert {"echo_lab.bench.harness", "echo_lab.replay.run", "echo_lab.training.trainer"} <= names
    assert IMPORTS["echo_server.kv.pool"] >= {"echo_server.model.attention"}


def test_no_production_module_imports_a_testing_module() -> None:
    offenders = sorted(
        f"{name} imports {target}"
        for name, targets in IMPORTS.items()
        if not is_testing(name)
        for target in targets
        if target.startswith(FIRST_PARTY_PREFIX) and is_testing(target)
    )
    assert not offenders, "production code imports test fixtures:\n" + "\n".join(offenders)


def test_the_product_never_imports_the_lab() -> None:
    offenders = sorted(
        f"{name} imports {target}"
        for name, targets in IMPORTS.items()
        if not name.startswith("echo_lab")
        for target in targets
        if target == "echo_lab" or target.startswith("echo_lab.")
    )
    assert not offenders, "a serving package imports echo-lab:\n" + "\n".join(offenders)


def test_the_serving_packages_hold_no_lab_modules() -> None:
    lab_words = {"bench", "replay", "training", "simulation"}
    misplaced = sorted(
        name
        for name in IMPORTS
        if not name.startswith("echo_lab") and lab_words & set(name.split(".")[1:])
    )
    assert not misplaced, "lab modules outside echo-lab:\n" + "\n".join(misplaced)


def server_layer(name: str) -> str | None:
    """``echo_server.<layer>`` of a module name (a subpackage or a top-level module)."""
    parts = name.split(".")
    return parts[1] if parts[0] == "echo_server" and len(parts) > 1 else None


def server_layer_graph() -> dict[str, set[str]]:
    """Layer -> the other echo_server layers its modules import."""
    graph: dict[str, set[str]] = {}
    for name, targets in IMPORTS.items():
        layer = server_layer(name)
        if layer is None:
            continue
        deps = graph.setdefault(layer, set())
        deps.update(d for d in map(server_layer, targets) if d is not None and d != layer)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_find_cycle_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_server_model_never_imports_kv() -> None:
    offenders = sorted(
        f"{name} imports {target}"
        for name, targets in IMPORTS.items()
        if server_layer(name) == "model"
        for target in targets
        if server_layer(target) == "kv"
    )
    assert not offenders, "\n".join(offenders)


def test_model_kv_drafting_engine_imports_have_no_cycle() -> None:
    layers = {"model", "kv", "drafting", "engine"}
    graph = {k: v & layers for k, v in server_layer_graph().items() if k in layers}
    assert set(graph) == layers
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle between echo_server layers: " + " -> ".join(cycle or [])


def test_the_node_imports_no_transport_and_only_the_cli_assembles_both() -> None:
    graph = server_layer_graph()
    assert "node" in graph
    assert not graph["node"] & {"grpc", "http"}, f"echo_server.node imports {graph['node']}"
    assert "http" not in graph["grpc"]
    both = sorted(layer for layer, deps in graph.items() if {"grpc", "http"} <= deps)
    assert both == ["cli"], f"layers importing both transports: {both}"
