"""Per-request contiguous copies of the KV pool, so that CPU attention reads K/V in place.

The pool keeps one token per slot (``[S, Hkv, D]`` per layer), its slots scattered over the
requests, so :class:`~echo_server.model.torch_attention.TorchAttention` gathers every request's
context into a dense ``[B, C, Hkv, D]`` tensor for K and for V in every layer: ``2 B C Hkv D``
elements copied per layer although at most a few rows per request changed since the last step.

The mirror keeps, per layer, K and V as ``[lanes, Hkv, cap, D]``: lane ``l`` is slot-table row
``l`` (one request), column ``c`` its token at position ``c``. Requests on lanes ``lo..hi-1``
then attend over ``mirror[lo:hi, :, :C]``, a strided view that SDPA reads without a copy (lanes
of that range outside the group run as empty requests: zero query rows that see column 0 only,
their output dropped). Head-major, so that each (request, KV head) block SDPA reads is one
contiguous run: while this was built (2026-12-05, plain decoding at c = 16 on MT-Bench, every
group mirrored, one engine) the decode SDPA of a run took 5.8 s with ``[lanes, cap, Hkv, D]``
against 4.1 s head-major, and 3.7 s on a fresh gather.

Per forward only the columns that are not current are copied, once per layer (``index_select``
from the pool, ``index_put_`` into the lanes): in a decode step the new rows, and the accepted
draft rows a commit moved.

Currency. ``held[l, c]`` is the slot whose K/V lane ``l`` column ``c`` holds, as of the end of
the last forward that read lane ``l``, and ``valid_upto[l]`` how many of its columns that forward
covered. A forward over lane ``l`` with ``cache_len`` prefix columns and ``rows`` new rows copies
column ``c < cache_len + rows`` unless

    c < cache_len  and  c < valid_upto[l]  and  held[l, c] == slot read at c,

then sets ``valid_upto[l] = cache_len + rows``. That is exact because a slot's K/V only change
when it is written as a new row, and a slot in a request's prefix was a new row of that request
in an earlier forward and is owned by it since: the forward that wrote it either copied it (new
rows are always copied) or left ``valid_upto[l] <= its column`` (a forward that reads lane ``l``
from the pool instead sets ``valid_upto[l] = min(valid_upto[l], cache_len)``). A slot freed and
reused elsewhere meanwhile can only come back to lane ``l`` as a new row, copied again. A new
request on a reused lane starts from ``cache_len = 0``.

A forward that raises part-way leaves some layers behind the metadata: :meth:`MirrorState.begin`
marks the state in flight, the last layer's attend clears it, and a plan that finds it still set
forgets every lane (``valid_upto = 0``).

When it pays: only for long contexts. A group of requests is read from the mirrors when its
longest context reaches ``MirrorConfig.min_context`` (:data:`MIN_CONTEXT`, from the
measurements quoted there); shorter groups gather from the pool as before, and the lanes they
wrote are caught up (copied) the first time they are mirrored.

Memory: ``2 L lanes cap Hkv D`` elements, allocated at the first mirrored forward for every
slot-table row, the columns doubled as the requests need (old contents kept), refused (the
forward reads the pool instead) beyond ``max_bytes``. Measured numbers: docs/lab/2026-12-05.md
(commit ``96e0c7c``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor

from echo_server.model.attention import NULL_SLOT

MIRROR_BYTES = 2 << 30
"""Default most bytes of K/V mirrors per KV pool (:attr:`MirrorConfig.max_bytes`)."""

MIN_CONTEXT = 1024
"""Default shortest widest-context of a group of requests read from the mirrors
(:attr:`MirrorConfig.min_context`). Measured on the 2-core AMD EPYC, one thread, plain decoding
at c = 8 (``scripts/profile_step_pieces.py``): at contexts of about 1,400 tokens a decode step
took 87.7 ms from the mirrors against 136.2 ms gathering from the pool (about 700 tokens: 79.4
against 106.8); at MT-Bench's 150-450 the two were level in one engine (20.0 against 20.3 ms of
attention a step) and the mirrors 1-9% slower in lockstep rounds beside other engines, SDPA
reading the mirrors from memory where it reads a fresh gather from cache
(docs/lab/2026-12-05.md)."""


@dataclass(frozen=True, slots=True)
class MirrorConfig:
    """What the mirrors need to know of the model: ``num_layers`` attend calls per forward,
    ``row_bytes = Hkv D`` times the element size of one token's K in one layer; and the most
    bytes of mirrors per KV pool, ``2 num_layers lanes cap row_bytes <= max_bytes``."""

    num_layers: int
    row_bytes: int
    max_bytes: int = MIRROR_BYTES
    min_context: int = MIN_CONTEXT
    """A group of requests is read from the mirrors only when its longest context (prefix and
    new rows) reaches this; shorter groups gather from the pool (:data:`MIN_CONTEXT`)."""

    def __post_init__(self) -> None:
        if self.num_layers < 1 or self.row_bytes < 1 or self.max_bytes < 0 or self.min_context < 0:
            raise ValueError(
                f"a mirror needs layers and row bytes >= 1, max_bytes and min_context >= 0: {self}"
            )

    def bytes(self, lanes: int, cap: int) -> int:
        """Bytes of K and V mirrors of ``lanes`` lanes by ``cap`` columns over every layer."""
        return 2 * self.num_layers * lanes * cap * self.row_bytes


def _grown(have: int, need: int, quantum: int) -> int:
    """``have`` doubled (at least to ``need``), rounded up to ``quantum``."""
    if need <= have:
        return have
    size = max(need, 2 * have)
    return -(-size // quantum) * quantum


@dataclass(slots=True)
class MirrorState:
    """The mirrors of one KV pool (identified by its slot table) and their currency."""

    table: weakref.ref[Tensor]
    config: MirrorConfig
    held: Tensor  # [lanes, cap] int64
    valid_upto: Tensor  # [lanes] int64
    layers: list[tuple[Tensor, Tensor] | None] = field(default_factory=list)
    in_flight: bool = False
    calls: int = 0

    @classmethod
    def new(cls, table: Tensor, config: MirrorConfig) -> MirrorState:
        """Empty mirrors for the pool of ``table`` (sized at the first forward that reads them)."""
        dev = table.device
        held = torch.full((0, 0), NULL_SLOT, dtype=torch.int64, device=dev)
        valid = torch.zeros(0, dtype=torch.int64, device=dev)
        return cls(weakref.ref(table), config, held, valid, [None] * config.num_layers)

    @property
    def lanes(self) -> int:
        return int(self.held.shape[0])

    @property
    def cap(self) -> int:
        return int(self.held.shape[1])

    def forget(self) -> None:
        """No column of any lane is current any more (a forward failed part-way)."""
        self.valid_upto.zero_()
        self.in_flight = False

    def reserve(self, lanes: int, cap: int) -> bool:
        """Grow the metadata to hold ``lanes`` lanes of ``cap`` columns; False (nothing changed)
        when the mirrors would then exceed ``max_bytes``. Layers grow at their next attend."""
        table = self.table()
        if not self.lanes and table is not None:  # every slot-table row at once
            lanes = max(lanes, int(table.shape[0]))
        lanes = _grown(self.lanes, lanes, 8)
        cap = _grown(self.cap, cap, 256)
        if self.config.bytes(lanes, cap) > self.config.max_bytes:
            return False
        if (lanes, cap) == (self.lanes, self.cap):
            return True
        held = self.held.new_full((lanes, cap), NULL_SLOT)
        held[: self.lanes, : self.cap] = self.held
        valid = self.valid_upto.new_zeros(lanes)
        valid[: self.lanes] = self.valid_upto
        self.held, self.valid_upto = held, valid
        return True

    def begin(self) -> None:
        """A forward that reads the mirrors starts (module docstring: failed forwards)."""
        self.in_flight = True
        self.calls = 0

    def next_layer(self, k_cache: Tensor, v_cache: Tensor) -> tuple[Tensor, Tensor]:
        """The mirrors ``[lanes, Hkv, cap, D]`` of the forward's next layer, grown to the
        metadata's size (contents kept); the last layer's call ends the forward."""
        index, layers = self.calls, self.config.num_layers
        if index >= layers:
            raise RuntimeError(f"attend called more than the {layers} layers planned")
        if k_cache[0].numel() * k_cache.element_size() != self.config.row_bytes:
            raise ValueError(f"K rows of {tuple(k_cache.shape[1:])} do not fit {self.config}")
        self.calls += 1
        if self.calls == layers:
            self.in_flight = False
        shape = (self.lanes, k_cache.shape[1], self.cap, k_cache.shape[2])
        pair = self.layers[index]
        if pair is None or pair[0].shape != shape:
            fresh = (k_cache.new_zeros(shape), v_cache.new_zeros(shape))
            if pair is not None:
                lanes, cap = pair[0].shape[0], pair[0].shape[2]
                fresh[0][:lanes, :, :cap] = pair[0]
                fresh[1][:lanes, :, :cap] = pair[1]
            pair = self.layers[index] = fresh
        return pair


@dataclass(frozen=True, slots=True)
class MirrorCopies:
    """Columns to copy from the pool into the mirrors, in every layer: ``[n]`` int64 each."""

    lanes: Tensor
    cols: Tensor
    slots: Tensor

    def apply(self, mirror: Tensor, cache: Tensor) -> None:
        """``mirror[lanes, :, cols] = cache[slots]`` (one layer's K or V)."""
        if self.slots.numel():
            by_column = mirror.transpose(1, 2)  # [lanes, cap, Hkv, D] view
            by_column.index_put_((self.lanes, self.cols), cache.index_select(0, self.slots))


def stale_columns(
    state: MirrorState,
    lo: int,
    kv_index: Tensor,  # [span, C] int64, the slot each column of lanes lo.. reads
    cache_len: Tensor,  # [span] int64, 0 for lanes outside the forward
    context: Tensor,  # [span] int64, cache_len + new rows, 0 for lanes outside the forward
    present: Tensor,  # [span] bool, lanes the forward reads
) -> MirrorCopies:
    """The columns of lanes ``lo..lo+span-1`` that are not current (module docstring), and the
    metadata updated as if they were copied (the caller copies them in every layer)."""
    span, width = kv_index.shape
    col = torch.arange(width, device=kv_index.device)
    lanes = slice(lo, lo + span)
    held, valid = state.held[lanes, :width], state.valid_upto[lanes]
    current = (col < cache_len[:, None]) & (col < valid[:, None]) & (held == kv_index)  # [span, C]
    stale = (col < context[:, None]) & ~current
    li, ci = stale.nonzero(as_tuple=True)
    slots = kv_index[li, ci]
    li = li + lo
    state.held[li, ci] = slots
    state.valid_upto[lanes] = torch.where(present, context, valid)
    return MirrorCopies(li, ci, slots)
