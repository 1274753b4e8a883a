"""Stand-in for torchvision (PyPI's wheels are CUDA builds that fail to import beside the CPU
torch). Only the text path of SGLang runs here; multimodal modules import this at module level and
never call it. Every submodule imports; every attribute is a placeholder that raises when used."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+echo-standin"


class _Unavailable:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Unavailable:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args: object, **kwargs: object) -> object:
        raise RuntimeError(f"{self._name}: torchvision is not installed (stand-in module)")

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        return (object,)


class _Module(types.ModuleType):
    def __getattr__(self, attr: str) -> object:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        pass


sys.meta_path.insert(0, _Finder())
sys.modules[__name__].__class__ = _Module
