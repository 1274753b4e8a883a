"""echo-sglang installs into an SGLang environment without echo-server: it never imports it.

Every module of ``echo_sglang`` is imported in a fresh interpreter where ``import echo_server``
raises and ``sglang`` is a stub (so the GPU-only modules load on CPU too); a static pass over the
sources catches imports inside functions, which importing the modules does not run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import echo_sglang

FORBIDDEN = "echo_server"
SOURCES = Path(echo_sglang.__file__).resolve().parent

IMPORT_ALL = textwrap.dedent(
    """
    import importlib
    import importlib.abc
    import importlib.machinery
    import pkgutil
    import sys
    import types

    FORBIDDEN = sys.argv[1]


    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == FORBIDDEN or name.startswith(FORBIDDEN + "."):
                raise ImportError(f"echo_sglang must not import {name}")
            return None


    class AnyAttr(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return AnyAttr(name, (), {})


    def stub_attribute(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return AnyAttr(name, (), {})


    class StubSGLang(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        # Any sglang.* module, every attribute a class: the plugin's own code still runs.
        def find_spec(self, name, path=None, target=None):
            if name == "sglang" or name.startswith("sglang."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            module = types.ModuleType(spec.name)
            module.__path__ = []
            module.__getattr__ = stub_attribute
            return module

        def exec_module(self, module):
            pass


    sys.meta_path[:0] = [Block(), StubSGLang()]
    import echo_sglang

    names = ["echo_sglang"]
    for info in pkgutil.walk_packages(echo_sglang.__path__, "echo_sglang."):
        importlib.import_module(info.name)
        names.append(info.name)
    leaked = sorted(m for m in sys.modules if m == FORBIDDEN or m.startswith(FORBIDDEN + "."))
    assert not leaked, leaked
    print(" ".join(names))
    """
)


def test_every_module_imports_with_echo_server_blocked() -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, FORBIDDEN],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    imported = set(done.stdout.split())
    expected = {
        "echo_sglang" if p.stem == "__init__" else f"echo_sglang.{p.stem}"
        for p in SOURCES.glob("*.py")
    }
    assert expected <= imported, sorted(expected - imported)


def _imported_names(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names.append(node.module)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.append(node.args[0].value)  # importlib.import_module("..."), __import__("...")
    return names


def test_no_source_names_echo_server_in_an_import() -> None:
    offenders = [
        f"{path.name}: {name}"
        for path in sorted(SOURCES.rglob("*.py"))
        for name in _imported_names(ast.parse(path.read_text(encoding="utf-8")))
        if name == FORBIDDEN or name.startswith(FORBIDDEN + ".")
    ]
    assert not offenders
