"""The KV slot pool: preallocated K/V storage, a request-to-slot table, admission math.

Storage is one tensor ``[L, 2, S + 1, Hkv, D]`` (layer, K/V, slot, head, dim); slot 0 is the null
slot. A slot holds one token's K and V in every layer, so a token costs
``bytes_per_slot = L * 2 * Hkv * D * dtype_bytes`` and a budget of ``M`` bytes buys
``floor(M / bytes_per_slot) - 1`` usable slots. Example: SmolLM2-135M (30 layers, 3 KV heads of
64) in float32 needs 30 * 2 * 3 * 64 * 4 = 46,080 bytes per token, so 1 GiB holds 23,300.

Requests own a row of ``slot_table`` ([max_requests, max_context] int64): entry ``c`` of a row is
the slot of the request's token at position ``c`` for ``c < cache_len``. Slots come from a
:class:`SlotAllocator`; a verify pass allocates slots for every tree row and
:func:`echo_server.kv.commit.commit_verified` keeps the accepted ones (through echo-kernels'
``commit_kv``, which writes ``slot_table`` in place, then :meth:`KVPool.grow`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NewType

import torch
from torch import Tensor

from echo_server.kv.errors import KVCapacityError, KVStateError
from echo_server.kv.slots import NULL_SLOT, SlotAllocator
from echo_server.model.attention import AttentionBatch, make_batch
from echo_server.model.config import ModelConfig

RequestHandle = NewType("RequestHandle", int)
"""A request's row in the slot table."""


def slots_for_budget(config: ModelConfig, budget_bytes: int, dtype: torch.dtype) -> int:
    """Usable slots that ``budget_bytes`` of K/V storage buys (the null slot deducted)."""
    per_slot = config.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size())
    slots = budget_bytes // per_slot - 1
    if slots < 1:
        raise KVCapacityError(
            f"KV budget of {budget_bytes} bytes is below 2 slots of {per_slot} bytes each"
        )
    return int(slots)


class KVPool:
    """Preallocated K/V storage shared by all running requests (module docstring)."""

    def __init__(
        self,
        config: ModelConfig,
        num_slots: int,
        max_requests: int = 64,
        max_context: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        check: bool = True,
    ) -> None:
        if max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests}")
        self.config = config
        self.max_context = min(max_context or config.max_context, config.max_context)
        self.max_requests = max_requests
        self.slots = SlotAllocator(num_slots, device, check)
        self.storage = torch.zeros(  # [L, 2, S + 1, Hkv, D]
            config.num_layers,
            2,
            num_slots + 1,
            config.num_kv_heads,
            config.head_dim,
            dtype=dtype,
            device=device,
        )
        self.slot_table = torch.full(  # [max_requests, max_context] int64
            (max_requests, self.max_context), NULL_SLOT, dtype=torch.int64, device=device
        )
        self._free_rows = list(range(max_requests - 1, -1, -1))
        self._cache_len: dict[RequestHandle, int] = {}

    @classmethod
    def for_budget(
        cls,
        config: ModelConfig,
        budget_bytes: int,
        max_requests: int = 64,
        max_context: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> KVPool:
        """A pool whose K/V storage fits ``budget_bytes`` (see :func:`slots_for_budget`)."""
        num_slots = slots_for_budget(config, budget_bytes, dtype)
        return cls(config, num_slots, max_requests, max_context, dtype, device)

    @property
    def num_slots(self) -> int:
        return self.slots.num_slots

    @property
    def num_free(self) -> int:
        return self.slots.num_free

    @property
    def num_requests(self) -> int:
        return len(self._cache_len)

    # -- admission ---------------------------------------------------------------------------

    def why_never_fits(self, tokens: int) -> str | None:
        """Why a request needing ``tokens`` slots can never run here, or None if it can."""
        if tokens > self.max_context:
            return f"request needs {tokens} tokens of context, the maximum is {self.max_context}"
        if tokens > self.num_slots:
            return f"request needs {tokens} KV slots, the pool has {self.num_slots} in total"
        return None

    def check_fits(self, tokens: int) -> None:
        """Raise :class:`KVCapacityError` if a request of ``tokens`` slots can never fit."""
        reason = self.why_never_fits(tokens)
        if reason is not None:
            raise KVCapacityError(reason)

    def can_admit(self, tokens: int) -> bool:
        """Whether a new request needing ``tokens`` slots fits now (else it waits)."""
        return bool(self._free_rows) and tokens <= self.num_free and tokens <= self.max_context

    # -- requests ----------------------------------------------------------------------------

    def add_request(self) -> RequestHandle:
        """Reserve a slot-table row for a new request with an empty cache."""
        if not self._free_rows:
            raise KVCapacityError(f"all {self.max_requests} request rows are in use")
        handle = RequestHandle(self._free_rows.pop())
        self._cache_len[handle] = 0
        return handle

    def release_request(self, handle: RequestHandle) -> None:
        """Free every slot the request holds and its table row."""
        n = self.cache_len(handle)
        self.slots.free(self.slot_table[handle, :n].clone())
        self.slot_table[handle, :n] = NULL_SLOT
        del self._cache_len[handle]
        self._free_rows.append(handle)

    def cache_len(self, handle: RequestHandle) -> int:
        if handle not in self._cache_len:
            raise KVStateError(f"unknown request handle {handle}")
        return self._cache_len[handle]

    def request_slots(self, handle: RequestHandle) -> Tensor:
        """The request's cached slots in position order: [cache_len] int64 (a view)."""
        return self.slot_table[handle, : self.cache_len(handle)]

    # -- slots -------------------------------------------------------------------------------

    def allocate(self, n: int) -> Tensor:
        """``n`` free slots for new rows: [n] int64."""
        return self.slots.allocate(n)

    def free(self, slots: Tensor) -> None:
        """Return uncommitted slots ([n] int64), e.g. rejected tree nodes."""
        self.slots.free(slots)

    def append(
        self, handles: Sequence[RequestHandle], slots: Tensor, counts: Sequence[int]
    ) -> None:
        """Commit ``slots`` ([sum(counts)] int64, grouped per request in order) to the end of
        each request's cache: request ``handles[b]`` gets the next ``counts[b]`` of them."""
        if len(handles) != len(counts) or slots.shape != (sum(counts),):
            raise ValueError(
                f"{len(handles)} handles, {len(counts)} counts, slots {tuple(slots.shape)}"
            )
        starts = self.check_room(handles, counts)
        dev = slots.device
        count_t = torch.tensor(list(counts), dtype=torch.int64, device=dev)
        rows = torch.repeat_interleave(torch.tensor(list(handles), device=dev), count_t)
        offsets = torch.cumsum(count_t, 0) - count_t
        local = torch.arange(slots.numel(), device=dev) - torch.repeat_interleave(offsets, count_t)
        cols = torch.repeat_interleave(torch.tensor(starts, device=dev), count_t) + local
        self.slot_table[rows, cols] = slots
        self.grow(handles, counts)

    def check_room(self, handles: Sequence[RequestHandle], counts: Sequence[int]) -> list[int]:
        """The cache lengths of ``handles`` now; :class:`KVCapacityError` if one would pass
        ``max_context`` after ``counts[b]`` more tokens."""
        starts = [self.cache_len(h) for h in handles]
        for h, s, c in zip(handles, starts, counts, strict=True):
            if s + c > self.max_context:
                raise KVCapacityError(
                    f"request {h} would reach {s + c} tokens, the maximum is {self.max_context}"
                )
        return starts

    def grow(self, handles: Sequence[RequestHandle], counts: Sequence[int]) -> None:
        """Count ``counts[b]`` more cached tokens for ``handles[b]``, whose slots the caller has
        just written into ``slot_table`` after the old length (e.g. the KV commit)."""
        for h, c in zip(handles, counts, strict=True):
            self._cache_len[h] = self.cache_len(h) + c

    # -- attention metadata ------------------------------------------------------------------

    def attention_batch(
        self,
        handles: Sequence[RequestHandle],
        rows: Sequence[int],
        write_slots: Tensor,  # [sum(rows)] int64 from allocate()
        new_mask: Tensor | None = None,  # [sum(rows), max(rows)] bool; None = causal
    ) -> AttentionBatch:
        """Metadata for a forward where request ``handles[b]`` adds ``rows[b]`` new rows after
        its cached prefix (see :mod:`echo_server.model.attention`)."""
        cache = [self.cache_len(h) for h in handles]
        return make_batch(self.slot_table, list(handles), cache, rows, write_slots, new_mask)
