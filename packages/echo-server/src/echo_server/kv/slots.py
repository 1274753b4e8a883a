"""Free list of KV pool slots: O(1) host work per call, whatever the number of slots.

Slots ``1..num_slots`` are handed out; slot 0 (``NULL_SLOT``) is never allocated, so padded
reads in attention have a harmless target. The free list is a stack tensor on the pool's device:
``allocate(n)`` pops the top ``n``, ``free(slots)`` pushes them back.
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_server.kv.errors import KVCapacityError, KVStateError
from echo_server.model.attention import NULL_SLOT

__all__ = ["NULL_SLOT", "SlotAllocator"]


class SlotAllocator:
    """Stack of free slot ids with an in-use bitmap that catches double frees."""

    def __init__(self, num_slots: int, device: torch.device | str = "cpu", check: bool = True):
        if num_slots < 1:
            raise KVCapacityError(f"a pool needs at least 1 slot, got {num_slots}")
        self.num_slots = num_slots
        self.check = check
        # Reversed so that the first allocations get the low slot ids (easier to read in logs).
        self._stack = torch.arange(num_slots, 0, -1, dtype=torch.int64, device=device)  # [S]
        self._top = num_slots
        self._in_use = torch.zeros(num_slots + 1, dtype=torch.bool, device=device)  # [S+1]

    @property
    def num_free(self) -> int:
        return self._top

    def allocate(self, n: int) -> Tensor:
        """``n`` free slots: [n] int64; KVCapacityError when fewer are free."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} slots")
        if n > self._top:
            raise KVCapacityError(
                f"need {n} KV slots, only {self._top} of {self.num_slots} are free"
            )
        slots = self._stack[self._top - n : self._top].flip(0).clone()
        self._top -= n
        if self.check:
            self._in_use[slots] = True
        return slots

    def free(self, slots: Tensor) -> None:
        """Return ``slots`` ([n] int64) to the pool; KVStateError on a double or foreign free."""
        n = int(slots.numel())
        if n == 0:
            return
        if self.check:
            if int(slots.min()) < 1 or int(slots.max()) > self.num_slots:
                raise KVStateError(f"slots outside 1..{self.num_slots}: {slots.tolist()[:8]}")
            ordered = slots.sort().values
            duplicate = bool((ordered[1:] == ordered[:-1]).any())
            if duplicate or not bool(self._in_use[slots].all()):
                raise KVStateError(f"double free among slots {slots.tolist()[:8]}")
            self._in_use[slots] = False
        self._stack[self._top : self._top + n] = slots
        self._top += n
