"""KV slot pool: preallocated per-layer K/V storage, request-to-slot table, admission, commit."""

from echo_server.kv.commit import commit_verified, kept_rows
from echo_server.kv.errors import KVCapacityError, KVStateError
from echo_server.kv.pool import KVPool, RequestHandle, slots_for_budget
from echo_server.kv.slots import NULL_SLOT, SlotAllocator

__all__ = [
    "NULL_SLOT",
    "KVCapacityError",
    "KVPool",
    "KVStateError",
    "RequestHandle",
    "SlotAllocator",
    "commit_verified",
    "kept_rows",
    "slots_for_budget",
]
