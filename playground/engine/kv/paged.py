"""A paged KV cache in the manner of vLLM's PagedAttention, usable as the ``cache=`` of a transformers model.

Every layer keeps its keys and values in a pool of fixed-size blocks (``block_size`` token slots each); every
sequence (batch row) has a block table, the ids of its blocks in order, the same for all layers. Token ``t`` of a
row lives in slot ``table[t // block_size] * block_size + t % block_size`` of the pool (vLLM's slot mapping).
Blocks come from a free list when a sequence needs room and go back to it when no sequence holds them, so a
sequence holds at most ``block_size − 1`` unused slots, instead of a contiguous tensor reserved for the longest
possible output.

Sequences share blocks: ``fork`` (parallel samples of one prompt) and ``reorder_cache`` (beam search) copy block
tables, not keys, and count references. A write into a block that another sequence also holds copies that block
first (copy-on-write): only a partly filled last block can be written into, so beams that share a history share
all of its full blocks.

A real PagedAttention kernel reads the blocks in place through the block table. Here attention is transformers'
own (sdpa or eager), which wants contiguous [batch, kv_heads, seq, head_dim] tensors, so every layer gathers its
rows' slots for each forward pass: the same bytes the DynamicCache's ``torch.cat`` copies, bit-identical values,
and the gathered tensor is a temporary, not something the cache holds.

``kv_dtype`` "int8" / "int4" stores the blocks quantized (the codes and scales of ``kv.quantized``).

Pools are created (and grown) inside the forward pass: use the cache under one autograd mode throughout
(``torch.inference_mode()`` or ``torch.no_grad()``), as inference tensors cannot be written outside it.
"""

from __future__ import annotations

import heapq
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from playground.engine.kv.quantized import KV_BITS, decode_kv, encode_kv, full_attention_layers, part_shapes
from playground.events.kv import KVBlocks


class PagedLayer(CacheLayerMixin):
    """One layer's block pools; the block tables belong to the ``PagedCache``."""

    is_compileable = False
    is_croppable = True
    is_sliding = False

    def __init__(self, owner: PagedCache) -> None:
        # CacheLayerMixin.__init__ would assign ``keys``/``values``, which are read-only views here.
        self.owner = owner
        self.length = 0  # tokens written per row by this layer
        self.is_initialized = False
        # Per stored part: [kv_heads, blocks, block_size, ·]. Head-major: one head's slots are contiguous, so the
        # gather is one index_select along the slot dimension and a batch-1 result is contiguous (3× faster on CPU
        # than the slot-major [blocks, block_size, kv_heads, ·] of vLLM's GPU kernels).
        self.key_pools: tuple[torch.Tensor, ...] = ()
        self.value_pools: tuple[torch.Tensor, ...] = ()

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.heads, self.head_dim = key_states.shape[1], key_states.shape[3]
        self.key_pools = self.value_pools = ()
        self.is_initialized = True
        self.grow(self.owner.capacity)

    def grow(self, blocks: int) -> None:
        """Make the pools ``blocks`` blocks long (new blocks uninitialised; they are written before being read)."""
        have = self.key_pools[0].shape[1] if self.key_pools else 0
        if not self.is_initialized or blocks <= have:
            return
        shapes = part_shapes(self.owner.kv_dtype, self.head_dim, self.dtype)

        def extended(pools: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            extra = [torch.empty(self.heads, blocks - have, self.owner.block_size, size, dtype=d, device=self.device)
                     for size, d in shapes]
            return tuple(torch.cat((p, e), dim=1) for p, e in zip(pools, extra, strict=True)) if pools else tuple(extra)

        self.key_pools, self.value_pools = extended(self.key_pools), extended(self.value_pools)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: block ``dst`` becomes a copy of block ``src`` for every (src, dst)."""
        if not self.is_initialized or not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        for pool in (*self.key_pools, *self.value_pools):
            pool.index_copy_(1, dst, pool.index_select(1, src))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states, value_states: [b, h, q, d] -> all keys and values of the rows: [b, h, length + q, d]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        rows, _, q, _ = key_states.shape
        start, end = self.length, self.length + q
        slots = self.owner.reserve(rows, start, end)  # [b, end]: allocates, copies shared blocks, grows the pools
        written = slots[:, start:].reshape(-1)  # [b·q]
        self._write(self.key_pools, key_states, written)
        self._write(self.value_pools, value_states, written)
        self.length = end
        return self._gather(self.key_pools, slots), self._gather(self.value_pools, slots)

    def _write(self, pools: tuple[torch.Tensor, ...], states: torch.Tensor, slots: torch.Tensor) -> None:
        """states: [b, h, q, d] into slots [b·q]."""
        heads = states.shape[1]
        for pool, part in zip(pools, encode_kv(states, self.owner.kv_dtype), strict=True):  # part: [b, h, q, ·]
            pool.view(heads, -1, pool.shape[-1]).index_copy_(1, slots, part.transpose(0, 1).reshape(heads, -1,
                                                                                                   pool.shape[-1]))

    def _gather(self, pools: tuple[torch.Tensor, ...], slots: torch.Tensor) -> torch.Tensor:
        """slots: [b, n] -> the rows' keys or values [b, h, n, d] (a copy: on CPU we gather, no in-place kernel)."""
        rows, n = slots.shape
        flat = slots.reshape(-1)
        parts = tuple(pool.view(self.heads, -1, pool.shape[-1]).index_select(1, flat)  # [h, b·n, ·]
                      .view(self.heads, rows, n, pool.shape[-1]).transpose(0, 1) for pool in pools)  # [b, h, n, ·]
        return decode_kv(parts, self.owner.kv_dtype, self.dtype)

    @property
    def keys(self) -> torch.Tensor | None:  # [b, h, length, d], gathered
        return self._gather(self.key_pools, self.owner.slots(self.length)) if self.is_initialized else None

    @property
    def values(self) -> torch.Tensor | None:  # [b, h, length, d], gathered
        return self._gather(self.value_pools, self.owner.slots(self.length)) if self.is_initialized else None

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def slot_bytes(self) -> int:
        """Bytes of one token slot of this layer: keys and values of every KV head (codes and scales if quantized)."""
        if not self.is_initialized:
            return 0
        return sum(p[:, 0, 0].numel() * p.element_size() for p in (*self.key_pools, *self.value_pools))

    def reset(self) -> None:
        self.length = 0

    # Rows, lengths and blocks are the owner's business: transformers calls these per layer, the cache does it once.
    def crop(self, tokens_to_remove: int) -> None:
        self.length = max(self.length + min(tokens_to_remove, 0), 0)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None: ...
    def batch_repeat_interleave(self, repeats: int) -> None: ...
    def batch_select_indices(self, indices: torch.Tensor) -> None: ...


class PagedCache(Cache):
    """Block tables, reference counts and the free list, shared by all layers; see the module docstring.

    ``PagedCache(model.config, block_size=16)``; ``initial_blocks`` reserves the pool up front (as vLLM does from
    its memory budget); otherwise the pool doubles when the free list runs dry."""

    def __init__(self, config: Any, block_size: int = 16, kv_dtype: str = "model", initial_blocks: int = 0) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1 (got {block_size})")
        if kv_dtype != "model" and kv_dtype not in KV_BITS:
            raise ValueError(f"kv_dtype must be 'model' or one of {sorted(KV_BITS)} (got {kv_dtype!r})")
        self.block_size, self.kv_dtype = block_size, kv_dtype
        self.capacity = 0
        self.refs: list[int] = []  # per block: how many tables hold it
        self.free: list[int] = []  # a min-heap: the lowest free id is taken first
        self.tables: list[list[int]] = []  # per row: block ids in token order
        self._version = 0  # bumped whenever a table changes (invalidates the slot mapping)
        self._slots_for: tuple[int, int] = (-1, -1)
        self._slots = torch.empty(0, 0, dtype=torch.long)
        super().__init__(layers=[PagedLayer(self) for _ in range(full_attention_layers(config))])
        self._grow(initial_blocks)

    # --- blocks -------------------------------------------------------------------------------------------------
    def _grow(self, blocks: int) -> None:
        if blocks <= self.capacity:
            return
        self.refs += [0] * (blocks - self.capacity)
        for block in range(self.capacity, blocks):
            heapq.heappush(self.free, block)
        self.capacity = blocks
        for layer in self.layers:
            layer.grow(blocks)

    def _take(self) -> int:
        if not self.free:
            self._grow(max(2 * self.capacity, 1))
        block = heapq.heappop(self.free)
        self.refs[block] = 1
        return block

    def _drop(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            heapq.heappush(self.free, block)

    def reserve(self, rows: int, start: int, length: int) -> torch.Tensor:
        """Make every row hold the blocks that positions < ``length`` need, and own alone those it is about to
        write (positions ``start`` .. ``length`` − 1); returns the slot mapping [rows, length].

        The first layer of a forward pass does the work (copying a shared block copies it in every layer, whose
        earlier positions are all written); the others find the tables ready."""
        if not self.tables and rows:
            self.tables = [[] for _ in range(rows)]
        if rows != len(self.tables):
            raise ValueError(f"the cache holds {len(self.tables)} sequences, the forward pass has {rows} rows "
                             f"(use fork or reorder_cache to change the batch)")
        first, need = start // self.block_size, -(-length // self.block_size)
        copies: list[tuple[int, int]] = []
        for table in self.tables:
            for j in range(first, min(need, len(table))):
                if self.refs[table[j]] > 1:  # shared: copy before anyone writes into it
                    old, table[j] = table[j], self._take()
                    self.refs[old] -= 1  # still held by another row: never reaches 0 here
                    copies.append((old, table[j]))
            while len(table) < need:
                table.append(self._take())
                self._version += 1
        if copies:
            self._version += 1
            for layer in self.layers:
                layer.copy_blocks(copies)
        return self.slots(length)

    def slots(self, length: int) -> torch.Tensor:
        """[rows, length] pool slot of every held position (cached until a table changes)."""
        if self._slots_for != (self._version, length):
            device = next((layer.device for layer in self.layers if layer.is_initialized), "cpu")
            n = -(-length // self.block_size)
            table = torch.tensor([t[:n] for t in self.tables], dtype=torch.long, device=device)
            table = table.reshape(len(self.tables), n)  # [rows, n] (also when there are no rows)
            offsets = torch.arange(self.block_size, device=device)
            self._slots = (table[:, :, None] * self.block_size + offsets).reshape(len(self.tables), -1)[:, :length]
            self._slots_for = (self._version, length)
        return self._slots

    def _set_tables(self, tables: list[list[int]]) -> None:
        """Replace the tables, holding the new references before dropping the old (shared blocks survive)."""
        for table in tables:
            for block in table:
                self.refs[block] += 1
        for table in self.tables:
            for block in table:
                self._drop(block)
        self.tables = tables
        self._version += 1

    # --- sequences ----------------------------------------------------------------------------------------------
    def fork(self, row: int, copies: int = 1) -> list[int]:
        """Append ``copies`` sequences that share row ``row``'s blocks (parallel samples of one prompt); returns
        their row indices. The next forward pass must have the new number of rows."""
        first = len(self.tables)
        self._set_tables([list(t) for t in self.tables] + [list(self.tables[row]) for _ in range(copies)])
        return list(range(first, first + copies))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Row i becomes old row beam_idx[i] by sharing its blocks (beam search; may change the number of rows)."""
        self._set_tables([list(self.tables[i]) for i in beam_idx.tolist()])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._set_tables([list(t) for t in self.tables for _ in range(repeats)])

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(torch.arange(len(self.tables))[indices])

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions of every row (negative, as DynamicCache.crop); blocks no
        longer needed go back to the free list once no sequence holds them."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to drop (as DynamicCache.crop)")
        for layer in self.layers:
            layer.crop(tokens_to_remove)
        keep = -(-max(layer.length for layer in self.layers) // self.block_size)
        self._set_tables([t[:keep] for t in self.tables])

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
        self._set_tables([])

    # --- what it holds ------------------------------------------------------------------------------------------
    def blocks(self) -> KVBlocks:
        """Block tables, shared blocks (counted once) and fragmentation: 1 − slots used / slots allocated."""
        length = self.get_seq_length()
        used: dict[int, int] = {}
        for table in self.tables:
            for j, block in enumerate(table):
                used[block] = max(used.get(block, 0), min(self.block_size, max(length - j * self.block_size, 0)))
        allocated = len(used) * self.block_size
        slots_used = sum(used.values())
        return KVBlocks(tables=tuple(tuple(t) for t in self.tables),
                        shared=tuple(sorted(b for b in used if self.refs[b] > 1)),
                        blocks_allocated=len(used), slots_allocated=allocated, slots_used=slots_used,
                        fragmentation=1.0 - slots_used / allocated if allocated else 0.0)

    def layer_bytes(self) -> tuple[int, ...]:
        """Per layer: bytes of the blocks sequences hold (their unused tail slots included)."""
        blocks = len({b for t in self.tables for b in t})
        return tuple(blocks * self.block_size * layer.slot_bytes() for layer in self.layers)

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks sequences hold, all layers, keys and values (each shared block once)."""
        return sum(self.layer_bytes())

    @property
    def used_bytes(self) -> int:
        """Bytes of the slots that hold a token (``nbytes`` less the unused tail of the last blocks)."""
        return self.blocks().slots_used * sum(layer.slot_bytes() for layer in self.layers)

    @property
    def reserved_bytes(self) -> int:
        """Bytes of the whole pool, free blocks included (what the process has allocated for the cache)."""
        return self.capacity * self.block_size * sum(layer.slot_bytes() for layer in self.layers)
