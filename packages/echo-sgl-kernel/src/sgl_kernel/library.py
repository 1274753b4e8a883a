"""The single ``torch.library`` that owns the ``sgl_kernel`` op namespace.

PyTorch allows one ``DEF`` library per namespace per process, so every module of this package
(and spec.py) registers through :func:`register` here rather than creating its own library.

Example::

    register("rmsnorm_cpu(Tensor input, Tensor weight, float eps) -> Tensor", rmsnorm_cpu)
    torch.ops.sgl_kernel.rmsnorm_cpu(x, w, 1e-6)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

NAMESPACE = "sgl_kernel"
# Ops with tensor arguments run on CPU tensors; ops without any (thread setup, shm init) have no
# backend to dispatch on and take the composite key, as the compiled library's CatchAll does.
CPU_KEY = "CPU"
NO_TENSOR_KEY = "CompositeExplicitAutograd"

# torch.library.Library is untyped in torch's stubs; its methods take and return plain values.
LIBRARY = torch.library.Library(NAMESPACE, "DEF")  # type: ignore[no-untyped-call]
_registered: dict[str, str] = {}


def op_name(schema: str) -> str:
    """The op name of a schema string: the text before the first ``(``.

    >>> op_name("silu_and_mul_cpu(Tensor input) -> Tensor")
    'silu_and_mul_cpu'
    """
    name = schema.split("(", 1)[0].strip()
    if not name.isidentifier():
        raise ValueError(f"schema {schema!r} does not start with an op name")
    return name


def register(schema: str, impl: Callable[..., Any], *, dispatch_key: str = CPU_KEY) -> None:
    """Define ``sgl_kernel::<name>`` from ``schema`` and bind ``impl`` to it for ``dispatch_key``.

    Raises ValueError when the name is already registered by this package, naming both schemas,
    so two modules that claim one op fail loudly at import instead of one silently winning.
    """
    name = op_name(schema)
    if name in _registered:
        raise ValueError(
            f"sgl_kernel::{name} is already registered as {_registered[name]!r}; "
            f"cannot register it again as {schema!r}"
        )
    LIBRARY.define(schema)  # type: ignore[no-untyped-call]  # untyped in torch's stubs
    LIBRARY.impl(name, impl, dispatch_key)  # type: ignore[no-untyped-call]  # untyped in torch's stubs
    _registered[name] = schema


def registered_ops() -> dict[str, str]:
    """Every op this package registered, name -> schema (a copy)."""
    return dict(_registered)
