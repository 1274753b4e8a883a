"""What a node holds in memory (weights, packed copies, KV pool, drafter) and its resident set.

Bytes are counted once per storage: tensors that share one (a tied embedding and lm_head, a
view) count once, and the drafter counts only what the target model does not already hold. The
node trims its heap after loading (:func:`trim_heap`) and logs this at start-up
(``node_memory``); ``scripts/memory_report.py`` compares the idle
RSS with ``weights + packed + kv_pool + drafter`` and with the issue's target
``rss <= 1.5 x (weights + kv_pool)``.
"""

from __future__ import annotations

import ctypes
import os
import resource
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from echo_server.model.linear import Linear

MIB = 1024 * 1024


def _storage(t: Tensor) -> tuple[tuple[str, int], int]:
    """(identity, bytes) of the storage behind ``t``. oneDNN-packed weights are opaque tensors
    without a storage: each is its own, of ``numel x element size`` bytes (the reorder keeps the
    element count)."""
    try:
        storage = t.untyped_storage()
    except (NotImplementedError, RuntimeError):
        return (f"opaque:{t.device}", id(t)), t.numel() * t.element_size()
    return (str(t.device), storage.data_ptr()), storage.nbytes()


def _storage_key(t: Tensor) -> tuple[str, int]:
    return _storage(t)[0]


def unique_bytes(tensors: Iterable[Tensor], exclude: set[tuple[str, int]] | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (those in ``exclude`` skipped)."""
    seen = set(exclude or ())
    total = 0
    for t in tensors:
        if t.numel() == 0:
            continue
        key, nbytes = _storage(t)
        if key not in seen:
            seen.add(key)
            total += nbytes
    return total


def tensors_in(obj: Any, depth: int = 6) -> Iterator[Tensor]:
    """Every tensor reachable from ``obj`` through modules, Linears, containers, dataclasses and
    the attributes of echo_server objects (bounded depth; each object visited once)."""
    seen: set[int] = set()

    def walk(o: Any, left: int) -> Iterator[Tensor]:
        if left < 0 or id(o) in seen:
            return
        seen.add(id(o))
        if isinstance(o, Tensor):
            yield o
        elif isinstance(o, nn.Module):
            yield from o.parameters()
            yield from o.buffers()
        elif isinstance(o, Linear):
            yield from (t for t in (o.weight, o.bias, o.packed) if t is not None)
        elif isinstance(o, dict):
            for v in o.values():
                yield from walk(v, left - 1)
        elif isinstance(o, (list, tuple, set, frozenset)):
            for v in o:
                yield from walk(v, left - 1)
        elif type(o).__module__.startswith("echo_server"):
            names = list(getattr(o, "__dict__", {})) + list(getattr(type(o), "__slots__", ()))
            for name in names:
                yield from walk(getattr(o, name, None), left - 1)

    yield from walk(obj, depth)


def trim_heap() -> int:
    """Hand the C heap's free pages back to the OS (glibc ``malloc_trim(0)``; a no-op
    elsewhere) and return how many bytes the RSS fell. Loading frees gigabytes of dequantized
    and intermediate tensors that glibc otherwise keeps mapped (about 360 MiB of the embedded
    model's idle RSS on the dev CPU)."""
    before = rss_bytes()
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return 0
    libc.malloc_trim(0)
    return max(before - rss_bytes(), 0)


def rss_bytes() -> int:
    """Resident set size of this process now (``/proc/self/statm``; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass(frozen=True, slots=True)
class MemoryReport:
    weights: int  # plain parameter tensors the model keeps
    packed: int  # oneDNN-packed copies used by the projections
    kv_pool: int
    drafter: int  # the drafter's own tensors (not shared with the model)
    rss: int

    @property
    def accounted(self) -> int:
        return self.weights + self.packed + self.kv_pool + self.drafter

    @property
    def rss_over_weights_and_kv(self) -> float:
        """``rss / (weights + packed + kv_pool)``: the model's parameters, however stored."""
        return self.rss / max(self.weights + self.packed + self.kv_pool, 1)

    def log_fields(self) -> dict[str, float]:
        return {
            "weights_mib": round(self.weights / MIB, 1),
            "packed_mib": round(self.packed / MIB, 1),
            "kv_pool_mib": round(self.kv_pool / MIB, 1),
            "drafter_mib": round(self.drafter / MIB, 1),
            "rss_mib": round(self.rss / MIB, 1),
            "rss_over_weights_and_kv": round(self.rss_over_weights_and_kv, 2),
        }


def memory_report(model: Any, kv_storage: Tensor, drafter: Any) -> MemoryReport:
    """Count what ``model`` (a LlamaModel), the KV pool and ``drafter`` hold (module doc)."""
    plain = list(tensors_in(model.weights))
    packed = [lin.packed for mm in model.linears for lin in _projections(mm)] + [
        model.lm_head.packed
    ]
    packed_tensors = [t for t in packed if t is not None]
    model_keys = {_storage_key(t) for t in [*plain, *packed_tensors] if t.numel()}
    return MemoryReport(
        weights=unique_bytes(plain),
        packed=unique_bytes(packed_tensors),
        kv_pool=unique_bytes([kv_storage]),
        drafter=unique_bytes(tensors_in(drafter), exclude=model_keys),
        rss=rss_bytes(),
    )


def _projections(layer: Any) -> list[Linear]:
    """The :class:`Linear` fields of one layer's projections."""
    return [getattr(layer, name) for name in ("qkv", "o_proj", "gate_up", "down")]


__all__ = [
    "MIB",
    "MemoryReport",
    "memory_report",
    "rss_bytes",
    "tensors_in",
    "trim_heap",
    "unique_bytes",
]
