"""Test fixtures for device discipline; production code never imports this module.

On a CPU machine every tensor is on the CPU, so code that would stall or fail on a GPU runs fine.
Two torch function modes make those defects visible on the CPU:

- :class:`HostSyncCounter` counts the calls that copy a device value to the host (each one a
  device-to-host sync on CUDA): explicit reads (``item``, ``tolist``, ``bool()``/``int()``/
  ``float()``/``operator.index`` of a tensor, formatting, ``cpu``, ``numpy``, ``.to("cpu")`` with
  the literal string)
  indexing with a 0-dim integer tensor (read as an int), and ops whose output size depends on
  values (``nonzero``, boolean-mask indexing,
  ``repeat_interleave`` without ``output_size``, ``masked_select``, ``unique``, one-argument
  ``where``). A hot path's budget is the count per step; it must not grow with batch or tree
  size.
- :class:`DeviceGuard` records (or raises on) ops whose tensor arguments sit on different
  devices (a CPU 0-dim tensor is allowed, as torch allows it) and tensor factories called
  without an explicit ``device=``, which silently land on the CPU on a GPU machine.

A third, :class:`OpTrace`, lists the aten ops a region runs, with every tensor argument's shape,
dtype and device and every non-tensor argument's value. Two runs with equal traces launch the
same kernels with the same Python constants, which is what one CUDA graph needs to serve both
(their tensor inputs copied into its buffers). It does not see the values of tensors (a CPU
0-dim tensor mixed into a CUDA op is baked in by a graph too) nor storage addresses.

Both see only calls made while the mode is active, from Python, at the outermost level (torch
disables the mode while it runs the call it handles).
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

EXPLICIT_READS = frozenset(
    {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__format__", "cpu",
     "numpy"}
)  # fmt: skip
"""Tensor methods that return host values (``func.__name__``)."""

VALUE_SIZED = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"})
"""Ops whose output shape depends on tensor values (the host must read the count)."""

FACTORIES = frozenset(
    {"zeros", "ones", "empty", "full", "arange", "range", "linspace", "eye", "tensor",
     "as_tensor", "rand", "randn", "randint", "randperm", "empty_strided", "scalar_tensor"}
)  # fmt: skip
"""``torch.*`` factories whose device defaults to the CPU (``*_like`` inherit theirs)."""

_SKIP_DIRS = (str(Path(torch.__file__).parent), str(Path(__file__).resolve()))


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__name__", repr(func))


def _tensors(values: Iterator[Any] | Sequence[Any]) -> Iterator[Tensor]:
    for value in values:
        if isinstance(value, Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


def _caller() -> str:
    """``file:line`` of the innermost frame outside torch and this module."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP_DIRS):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"


def is_host_sync(
    name: str, args: Sequence[Any], kwargs: Mapping[str, Any], device_only: bool = False
) -> bool:
    """Whether ``torch`` call ``name(*args, **kwargs)`` reads device values on the host.

    ``device_only`` (on a GPU): only calls with a tensor argument off the CPU count, and ``to``
    counts for any CPU target (a ``torch.device`` too), so host-side work is not a sync."""
    if device_only:
        if not any(t.device.type != "cpu" for t in _tensors([*args, *kwargs.values()])):
            return False
        if name == "to":
            target = kwargs.get("device", args[1] if len(args) > 1 else None)
            return isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"
    if name in EXPLICIT_READS or name in VALUE_SIZED:
        return True
    if name == "to":  # a literal "cpu": a device taken from a tensor may be the GPU on a GPU
        target = kwargs.get("device", args[1] if len(args) > 1 else None)
        return isinstance(target, str) and torch.device(target).type == "cpu"
    if name == "repeat_interleave":
        repeats = kwargs.get("repeats", args[1] if len(args) > 1 else args[0])
        return isinstance(repeats, Tensor) and kwargs.get("output_size") is None
    if name == "where":
        return len(args) + len(kwargs) == 1
    if name in ("__getitem__", "__setitem__") and len(args) > 1:
        # a bool mask sizes the result by its count; a 0-dim integer index is read as a
        # Python int (torch's indexing calls ``item`` on it)
        return any(
            t.dtype == torch.bool or (t.dim() == 0 and not t.is_floating_point())
            for t in _tensors([args[1]])
        )
    return False


_Mode = TypeVar("_Mode", bound="_ObservingMode")


class _ObservingMode(TorchFunctionMode):
    """A torch function mode that looks at every call (:meth:`_observe`), then runs it."""

    def __enter__(self: _Mode) -> _Mode:
        super().__enter__()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        return self

    def _observe(
        self, func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> None:
        raise NotImplementedError

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        self._observe(func, args, kwargs)
        return func(*args, **kwargs)


class HostSyncCounter(_ObservingMode):
    """Counts host syncs by op (``counts``) and by op and call site (``sites``), module docstring.

    >>> with HostSyncCounter() as syncs:
    ...     _ = int(torch.ones(2).sum())
    >>> syncs.total
    1
    """

    def __init__(self, *, device_only: bool = False) -> None:
        """``device_only``: count only reads of tensors off the CPU (:func:`is_host_sync`); the
        default counts every such call, so a CPU run shows what a GPU run would sync on."""
        super().__init__()
        self.device_only = device_only
        self.counts: collections.Counter[str] = collections.Counter()
        self.sites: collections.Counter[tuple[str, str]] = collections.Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def _observe(
        self, func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> None:
        name = _name(func)
        if is_host_sync(name, args, kwargs, self.device_only):
            self.counts[name] += 1
            self.sites[(name, _caller())] += 1


class DeviceDisciplineError(AssertionError):
    """An op mixed devices or created a tensor on the default device (:class:`DeviceGuard`)."""


class DeviceGuard(_ObservingMode):
    """Records device-discipline violations as ``"op at file:line: reason"`` (module docstring);
    with ``strict`` (the default) the first one raises :class:`DeviceDisciplineError`."""

    def __init__(self, *, strict: bool = True) -> None:
        super().__init__()
        self.strict = strict
        self.violations: list[str] = []

    def _violate(self, name: str, reason: str) -> None:
        message = f"{name} at {_caller()}: {reason}"
        self.violations.append(message)
        if self.strict:
            raise DeviceDisciplineError(message)

    def _observe(
        self, func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> None:
        name = _name(func)
        if name in FACTORIES and getattr(torch, name, None) is func and "device" not in kwargs:
            self._violate(name, "tensor factory without an explicit device=")
        devices = {
            t.device
            for t in _tensors([*args, *kwargs.values()])
            if t.ndim or t.device.type != "cpu"
        }
        if len(devices) > 1:
            self._violate(name, f"tensors on {sorted(str(d) for d in devices)}")


def _op_argument(value: Any) -> object:
    """What a graph would bake in for one op argument: a tensor's shape, dtype and device, any
    other value itself (lists and tuples element by element)."""
    if isinstance(value, Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype), str(value.device))
    if isinstance(value, list | tuple):
        return tuple(_op_argument(v) for v in value)
    return value


class OpTrace(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    """The aten ops run inside the mode, in order (``ops``), each with its arguments as
    :func:`_op_argument` sees them (module docstring).

    >>> with OpTrace() as trace:
    ...     _ = torch.ones(2) * 3.0
    >>> [op for op, _ in trace.ops][-1]
    'aten.mul.Tensor'
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[tuple[str, object]] = []

    def __enter__(self) -> OpTrace:
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        described = (_op_argument(list(args)), tuple(sorted(
            (k, _op_argument(v)) for k, v in kwargs.items()
        )))  # fmt: skip
        self.ops.append((str(func), described))
        return func(*args, **kwargs)
