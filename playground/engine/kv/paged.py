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

Sliding-window layers (Mistral, Gemma 2 / 3's local layers) form their own group, with their own pool and block
tables, as vLLM's hybrid allocator keeps one KV-cache group per attention type: a pass on a sliding layer of
window w reads the newest w − 1 held positions and its own (what transformers' ``DynamicSlidingWindowLayer``
hands attention, with the same mask sizes), and a block that lies wholly before the window of every later pass
goes back to the group's free list; its table entry becomes ``NO_BLOCK`` (−1), so positions still map to
``table[t // block_size]``. A sliding group holds about ⌈(w − 1) / block_size⌉ + 1 blocks per sequence however
long the sequence grows; full-attention layers hold every block. ``blocks()`` describes the full-attention group
when there is one (the sliding group's blocks are in ``layer_bytes()``).

Pools are created (and grown) inside the forward pass: use the cache under one autograd mode throughout
(``torch.inference_mode()`` or ``torch.no_grad()``), as inference tensors cannot be written outside it.
"""

from __future__ import annotations

import hashlib
import heapq
import weakref
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any, cast

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from playground.engine.kv.quantized import KV_BITS, decode_kv, encode_kv, layer_windows, part_shapes
from playground.events.kv import KVBlocks

NO_BLOCK = -1  # a sliding-window table's entry for a block out of every later window (given back)


class PagedLayer(CacheLayerMixin):
    """One layer's block pools; the block tables belong to its ``BlockGroup``."""

    is_compileable = False
    is_croppable = True

    def __init__(self, owner: PagedCache, group: BlockGroup) -> None:
        # CacheLayerMixin.__init__ would assign ``keys``/``values``, which are read-only views here.
        self.owner, self.group = owner, group
        self.is_sliding = group.window is not None  # read by transformers' masks
        self.length = 0  # positions written per row by this layer (a sliding layer holds the newest of them)
        self.store = group.pool.layer(len(group.layers))  # this layer's blocks in the (maybe shared) pool
        self.is_initialized = False

    # Per stored part: [kv_heads, blocks, block_size, ·] (``LayerBlocks``), in the group's pool.
    @property
    def key_pools(self) -> tuple[torch.Tensor, ...]:
        return self.store.key_pools

    @property
    def value_pools(self) -> tuple[torch.Tensor, ...]:
        return self.store.value_pools

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.heads, self.head_dim = key_states.shape[1], key_states.shape[3]
        self.store.initialize(key_states, self.group.pool)  # a shared pool's store may already hold blocks
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        read = self._update(key_states, value_states)
        if self is self.group.layers[-1]:  # every layer of the pass has written: its full blocks are final
            self.owner.publish_prefix()
        return read

    def _update(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states, value_states: [b, h, q, d] -> the keys and values the pass reads: [b, h, length + q, d] on
        a full-attention layer, from the window's first position on (``get_mask_sizes``) on a sliding one."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        rows, _, q, _ = key_states.shape
        start, end = self.length, self.length + q
        first = self.group.first_read(start)
        slots = self.group.reserve(rows, start, end, first)  # [b, end − first]: allocates, copies, grows the pools
        written = slots[:, start - first:].reshape(-1)  # [b·q]
        self._write(self.key_pools, key_states, written)
        self._write(self.value_pools, value_states, written)
        self.length = end
        read = self._gather(self.key_pools, slots), self._gather(self.value_pools, slots)
        if self.group.window is not None and self is self.group.layers[-1]:  # the group's pass is over
            self.group.release_before(self.group.first_read(end))
        return read

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

    def _held(self, pools: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """What the layer holds: [b, h, length, d], or the newest window − 1 positions of a sliding layer."""
        first = self.group.first_read(self.length)
        return self._gather(pools, self.group.slots(first, self.length))

    @property  # the base's attribute, a read-only view here
    def keys(self) -> torch.Tensor | None:  # type: ignore[override]  # [b, h, held, d], gathered
        return self._held(self.key_pools) if self.is_initialized else None

    @property  # the base's attribute, a read-only view here
    def values(self) -> torch.Tensor | None:  # type: ignore[override]  # [b, h, held, d], gathered
        return self._held(self.value_pools) if self.is_initialized else None

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) of what the next pass reads (as ``DynamicSlidingWindowLayer`` on sliding layers)."""
        first = self.group.first_read(self.length)
        return self.length - first + query_length, first

    def get_max_length(self) -> int:
        return self.group.window if self.group.window is not None else -1

    def slot_bytes(self) -> int:
        """Bytes of one token slot of this layer: keys and values of every KV head (codes and scales if quantized)."""
        if not self.store.key_pools:
            return 0
        return sum(p[:, 0, 0].numel() * p.element_size() for p in (*self.key_pools, *self.value_pools))

    def reset(self) -> None:
        self.length = 0

    # Rows, lengths and blocks are the group's business: transformers calls these per layer, the cache does it once.
    def crop(self, tokens_to_remove: int) -> None:
        self.length = max(self.length + min(tokens_to_remove, 0), 0)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None: ...
    def batch_repeat_interleave(self, repeats: int) -> None: ...
    def batch_select_indices(self, indices: torch.Tensor) -> None: ...


class LayerBlocks:
    """One layer's stored parts in a pool: [kv_heads, blocks, block_size, ·] each. Head-major: one head's slots are
    contiguous, so the gather is one index_select along the slot dimension and a batch-1 result is contiguous (3×
    faster on CPU than the slot-major [blocks, block_size, kv_heads, ·] of vLLM's GPU kernels)."""

    def __init__(self) -> None:
        self.key_pools: tuple[torch.Tensor, ...] = ()
        self.value_pools: tuple[torch.Tensor, ...] = ()
        self.shape: tuple[int, int, torch.dtype, torch.device] | None = None  # heads, head dim, dtype, device

    def initialize(self, states: torch.Tensor, pool: BlockPool) -> None:
        shape = (states.shape[1], states.shape[3], states.dtype, states.device)
        if self.shape is not None and self.shape != shape:
            raise ValueError(f"a shared block pool holds {self.shape} keys, this pass writes {shape}")
        self.shape = shape
        self.grow(pool.capacity, pool)

    def grow(self, blocks: int, pool: BlockPool) -> None:
        """Make the pools ``blocks`` blocks long (new blocks uninitialised; they are written before being read)."""
        have = self.key_pools[0].shape[1] if self.key_pools else 0
        if self.shape is None or blocks <= have:
            return
        heads, head_dim, dtype, device = self.shape

        def extended(pools: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
            extra = [torch.empty(heads, blocks - have, pool.block_size, size, dtype=d, device=device)
                     for size, d in part_shapes(pool.kv_dtype, head_dim, dtype)]
            return tuple(torch.cat((p, e), dim=1) for p, e in zip(pools, extra, strict=True)) if pools else tuple(extra)

        self.key_pools, self.value_pools = extended(self.key_pools), extended(self.value_pools)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: block ``dst`` becomes a copy of block ``src`` for every (src, dst)."""
        if not self.key_pools or not pairs:
            return
        device = self.key_pools[0].device
        src = torch.tensor([s for s, _ in pairs], device=device)
        dst = torch.tensor([d for _, d in pairs], device=device)
        for pool in (*self.key_pools, *self.value_pools):
            pool.index_copy_(1, dst, pool.index_select(1, src))


class BlockPool:
    """Blocks of one attention group's layers: their storage, reference counts and free list, and (when shared
    across caches: ``prefix_pool``) an index of full prompt blocks other runs may reuse.

    The index maps a block's prefix hash (``prefix_hashes``) to the block and holds one reference to it, so the
    block outlives the run that wrote it; it keeps at most ``limit`` blocks, the least recently used going first
    (a block still in a live cache's table stays there, only the index lets go of it)."""

    def __init__(self, block_size: int, kv_dtype: str = "model", limit: int = 0) -> None:
        self.block_size, self.kv_dtype, self.limit = block_size, kv_dtype, limit
        self.capacity = 0
        self.refs: list[int] = []
        self.free: list[int] = []
        self.stores: list[LayerBlocks] = []
        self.index: OrderedDict[bytes, int] = OrderedDict()  # prefix hash -> block, least recently used first

    def layer(self, i: int) -> LayerBlocks:
        while len(self.stores) <= i:
            self.stores.append(LayerBlocks())
        return self.stores[i]

    def grow(self, blocks: int) -> None:
        if blocks <= self.capacity:
            return
        self.refs += [0] * (blocks - self.capacity)
        for block in range(self.capacity, blocks):
            heapq.heappush(self.free, block)
        self.capacity = blocks
        for store in self.stores:
            store.grow(blocks, self)

    def take(self) -> int:
        if not self.free:
            self.grow(max(2 * self.capacity, 1))
        block = heapq.heappop(self.free)
        self.refs[block] = 1
        return block

    def drop(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            heapq.heappush(self.free, block)

    # --- the prefix index ---------------------------------------------------------------------------------------
    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """The blocks of the longest indexed run of ``hashes`` from the first (each one referenced once more)."""
        found = []
        for key in hashes:
            block = self.index.get(key)
            if block is None:
                break
            self.index.move_to_end(key)
            self.refs[block] += 1
            found.append(block)
        return found

    def touch(self, keys: Sequence[bytes]) -> None:
        """A prefix's keys used: most recent first for its root, so the index lets go of a prefix's deepest blocks
        before its first (a radix tree's leaves first: a block is of use only with every block before it)."""
        for key in reversed(keys):
            if key in self.index:
                self.index.move_to_end(key)

    def publish(self, key: bytes, block: int) -> None:
        if key in self.index:  # written by two runs at once, or reused: the first stays
            self.index.move_to_end(key)
            return
        self.index[key] = block
        self.refs[block] += 1

    def trim(self) -> None:
        while len(self.index) > self.limit:
            _key, block = self.index.popitem(last=False)
            self.drop(block)

    def clear(self) -> None:
        """Forget every indexed block (those no cache holds go back to the free list)."""
        limit, self.limit = self.limit, 0
        self.trim()
        self.limit = limit


class Rows:
    """A group's block tables, and which of their blocks another run wrote (``PagedCache.share_prefix``)."""

    def __init__(self) -> None:
        self.tables: list[list[int]] = []
        self.reused: set[int] = set()


def _give_back(pool: BlockPool, rows: Rows) -> None:
    """A cache on a shared pool is gone: its tables' references go back (blocks the index holds stay)."""
    for table in rows.tables:
        for block in table:
            if block != NO_BLOCK:
                pool.drop(block)
    rows.tables = []


def prefix_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """One key per full block of ``token_ids``: a hash of every token up to the block's end (vLLM's hash chain).
    A block's keys and values depend on every earlier token, and its keys carry the rotary of their positions, so
    only the same tokens from the start match: the same block at another position, or after another prefix, not."""
    keys, previous = [], b""
    for end in range(block_size, len(token_ids) + 1, block_size):
        block = ",".join(str(t) for t in token_ids[end - block_size : end]).encode()
        previous = hashlib.blake2b(previous + b"|" + block, digest_size=16).digest()
        keys.append(previous)
    return keys


_POOLS: weakref.WeakKeyDictionary[Any, dict[tuple, BlockPool]] = weakref.WeakKeyDictionary()


def prefix_pool(model: Any, block_size: int, kv_dtype: str, limit: int) -> BlockPool:
    """The block pool paged caches of ``model`` share prefixes in, for this block size, KV dtype and attention
    implementation (sdpa and eager round differently), with ``limit`` blocks indexed. It lives as long as the
    model (held by weak reference: a model unloaded takes its pools with it)."""
    key = (block_size, kv_dtype, model.config._attn_implementation)
    pools = _POOLS.setdefault(model, {})
    pool = pools.get(key)
    if pool is None:
        pool = pools[key] = BlockPool(block_size, kv_dtype, limit)
    pool.limit = limit
    pool.trim()
    return pool


class BlockGroup:
    """Block tables, reference counts, the free list and the pool size of the layers of one attention type (all
    full-attention layers, or the sliding layers of one window)."""

    def __init__(self, block_size: int, window: int | None, pool: BlockPool | None = None,
                 kv_dtype: str = "model") -> None:
        self.block_size, self.window = block_size, window
        self.pool = pool if pool is not None else BlockPool(block_size, kv_dtype)
        self.layers: list[PagedLayer] = []
        self.rows = Rows()  # the tables, apart from the group, so a shared pool can take them back at the end
        self._version = 0  # bumped whenever a table changes (invalidates the slot mapping)
        self._slots_for: tuple[int, int, int] = (-1, -1, -1)
        self._slots = torch.empty(0, 0, dtype=torch.long)

    @property
    def tables(self) -> list[list[int]]:  # per row: block ids in token order (NO_BLOCK: given back)
        return self.rows.tables

    @tables.setter
    def tables(self, tables: list[list[int]]) -> None:
        self.rows.tables = tables

    @property
    def refs(self) -> list[int]:  # per block of the pool: how many tables (and the prefix index) hold it
        return self.pool.refs

    @property
    def free(self) -> list[int]:  # a min-heap: the lowest free id is taken first
        return self.pool.free

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    @property
    def length(self) -> int:
        return max((layer.length for layer in self.layers), default=0)

    def first_read(self, length: int) -> int:
        """The first position a pass after ``length`` positions reads: 0, or length − (window − 1) on a sliding
        group (a query attends to itself and the window − 1 positions before it)."""
        return 0 if self.window is None else max(length - self.window + 1, 0)

    def grow(self, blocks: int) -> None:
        self.pool.grow(blocks)

    def _take(self) -> int:
        block = self.pool.take()
        self.rows.reused.discard(block)  # an id the index let go of, now this cache's own
        return block

    def _drop(self, block: int) -> None:
        self.pool.drop(block)

    def reserve(self, rows: int, start: int, length: int, first: int = 0) -> torch.Tensor:
        """Make every row hold the blocks that positions ``first`` .. ``length`` − 1 need, and own alone those it is
        about to write (positions ``start`` .. ``length`` − 1); returns their slot mapping [rows, length − first].

        The first layer of a forward pass does the work (copying a shared block copies it in every layer of the
        group, whose earlier positions are all written); the others find the tables ready."""
        if not self.tables and rows:
            self.tables = [[] for _ in range(rows)]
        if rows != len(self.tables):
            raise ValueError(f"the cache holds {len(self.tables)} sequences, the forward pass has {rows} rows "
                             f"(use fork or reorder_cache to change the batch)")
        self.release_before(first)
        low, need = start // self.block_size, -(-length // self.block_size)
        copies: list[tuple[int, int]] = []
        for table in self.tables:
            for j in range(low, min(need, len(table))):
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
                layer.store.copy_blocks(copies)
        return self.slots(first, length)

    def release_before(self, first: int) -> None:
        """Give back every block that lies wholly before position ``first`` (no later pass reads it)."""
        whole = first // self.block_size
        for table in self.tables:
            for j in range(min(whole, len(table))):
                if table[j] != NO_BLOCK:
                    self._drop(table[j])
                    table[j] = NO_BLOCK
                    self._version += 1

    def slots(self, first: int, length: int) -> torch.Tensor:
        """[rows, length − first] pool slot of every position from ``first`` on (cached until a table changes)."""
        if self._slots_for != (self._version, first, length):
            device = next((layer.device for layer in self.layers if layer.is_initialized), "cpu")
            n = -(-length // self.block_size)
            table = torch.tensor([t[:n] for t in self.tables], dtype=torch.long, device=device)
            table = table.reshape(len(self.tables), n)  # [rows, n] (also when there are no rows)
            offsets = torch.arange(self.block_size, device=device)
            mapping = (table[:, :, None] * self.block_size + offsets).reshape(len(self.tables), -1)
            self._slots = mapping[:, first:length]
            self._slots_for = (self._version, first, length)
        return self._slots

    def set_tables(self, tables: list[list[int]]) -> None:
        """Replace the tables, holding the new references before dropping the old (shared blocks survive)."""
        for table in tables:
            for block in table:
                if block != NO_BLOCK:
                    self.refs[block] += 1
        for table in self.tables:
            for block in table:
                if block != NO_BLOCK:
                    self._drop(block)
        self.tables = tables
        self.rows.reused &= self.held()
        self._version += 1

    def crop(self, tokens_to_remove: int) -> None:
        length = max(self.length + tokens_to_remove, 0)
        first = self.first_read(length)
        for table in self.tables:
            given_back = [j for j in range(first // self.block_size, len(table)) if table[j] == NO_BLOCK]
            if given_back and given_back[0] * self.block_size < length:
                raise RuntimeError(f"cannot crop this sliding-window cache back to {length} positions: its window "
                                   f"({self.window}) has already given back the block of position "
                                   f"{given_back[0] * self.block_size}, which that length would read again")
        for layer in self.layers:
            layer.crop(tokens_to_remove)
        keep = -(-self.length // self.block_size)
        self.set_tables([t[:keep] for t in self.tables])

    def held(self) -> set[int]:
        return {b for t in self.tables for b in t if b != NO_BLOCK}

    def blocks(self) -> KVBlocks:
        """Block tables, shared blocks (counted once) and fragmentation: 1 − slots used / slots allocated, where a
        slot is used when it holds a position a later pass can read."""
        length = self.length
        first = self.first_read(length)
        used: dict[int, int] = {}
        for table in self.tables:
            for j, block in enumerate(table):
                if block == NO_BLOCK:
                    continue
                low, high = max(j * self.block_size, first), min((j + 1) * self.block_size, length)
                used[block] = max(used.get(block, 0), max(high - low, 0))
        allocated = len(used) * self.block_size
        slots_used = sum(used.values())
        rows_holding = Counter(b for t in self.tables for b in set(t) if b != NO_BLOCK)
        return KVBlocks(tables=tuple(tuple(t) for t in self.tables),
                        shared=tuple(sorted(b for b in used if rows_holding[b] > 1)),
                        reused=tuple(sorted(self.rows.reused & set(used))),
                        blocks_allocated=len(used), slots_allocated=allocated, slots_used=slots_used,
                        fragmentation=1.0 - slots_used / allocated if allocated else 0.0)

    def slot_bytes(self) -> int:
        """Bytes of one token slot in every layer of the group."""
        return sum(layer.slot_bytes() for layer in self.layers)


class PagedCache(Cache):
    """Block groups (one per attention type: see the module docstring) under one transformers ``Cache``.

    ``PagedCache(model.config, block_size=16)``; ``initial_blocks`` reserves every group's pool up front (as vLLM
    does from its memory budget); otherwise a pool doubles when its free list runs dry. ``tables``, ``refs``,
    ``free`` and ``capacity`` are the main group's: the full-attention layers', or the sliding ones' on a model
    that has no full-attention layer."""

    def __init__(self, config: Any, block_size: int = 16, kv_dtype: str = "model", initial_blocks: int = 0,
                 prefix_pool: BlockPool | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1 (got {block_size})")
        if kv_dtype != "model" and kv_dtype not in KV_BITS:
            raise ValueError(f"kv_dtype must be 'model' or one of {sorted(KV_BITS)} (got {kv_dtype!r})")
        if prefix_pool is not None and (prefix_pool.block_size, prefix_pool.kv_dtype) != (block_size, kv_dtype):
            raise ValueError("a shared block pool holds blocks of its own size and dtype")
        self.block_size, self.kv_dtype = block_size, kv_dtype
        windows = layer_windows(config)
        # Prefixes are shared when every layer attends to every position: a sliding layer gives its old blocks back.
        self.prefix_pool = prefix_pool if set(windows) == {None} else None
        self.prompt_keys: list[bytes] = []  # the prompt's full blocks' prefix hashes, to publish once written
        self.published = 0
        self.groups: dict[int | None, BlockGroup] = {}
        for window in sorted(set(windows), key=lambda w: (w is not None, w or 0)):  # full attention first
            self.groups[window] = BlockGroup(block_size, window, self.prefix_pool, kv_dtype)
        layers: list[Any] = []
        for window in windows:
            group = self.groups[window]
            group.layers.append(PagedLayer(self, group))
            layers.append(group.layers[-1])
        super().__init__(layers=layers)
        self.main = next(iter(self.groups.values()))
        for group in self.groups.values():
            group.grow(initial_blocks)
        if self.prefix_pool is not None:
            weakref.finalize(self, _give_back, self.prefix_pool, self.main.rows)

    # --- prefixes shared across runs (``prefix_pool``) ----------------------------------------------------------
    def share_prefix(self, token_ids: Sequence[int]) -> int:
        """Before the prompt ``token_ids`` is read into this (empty) cache: take the full blocks of its longest
        prefix that another run on the shared pool wrote, and remember the prompt's block hashes so the blocks this
        run writes are offered to later runs. Returns the positions taken (a multiple of the block size, short of
        the prompt's last token, which must still be read for its logits): read the prompt from there."""
        if self.prefix_pool is None or self.main.tables or self.main.length:
            return 0
        self.prompt_keys = prefix_hashes(token_ids, self.block_size)
        blocks = self.prefix_pool.lookup(self.prompt_keys[: (len(token_ids) - 1) // self.block_size])
        self.prefix_pool.touch(self.prompt_keys[: len(blocks)])
        if not blocks:
            return 0
        self.main.tables = [blocks]
        self.main.rows.reused = set(blocks)
        self.main._version += 1
        for layer in self.paged_layers():
            layer.length = len(blocks) * self.block_size
        self.published = len(blocks)
        return len(blocks) * self.block_size

    def publish_prefix(self) -> None:
        """Offer the prompt's blocks written so far (full, every layer done) to later runs."""
        if self.prefix_pool is None or not self.main.tables:
            return
        table, written = self.main.tables[0], self.main.length // self.block_size
        ready = min(len(self.prompt_keys), written, len(table))
        if self.published >= ready:
            return
        while self.published < ready:
            self.prefix_pool.publish(self.prompt_keys[self.published], table[self.published])
            self.published += 1
        self.prefix_pool.touch(self.prompt_keys[: self.published])
        self.prefix_pool.trim()
    # --- the main group's tables (what ``blocks()`` shows) -------------------------------------------------------
    @property
    def tables(self) -> list[list[int]]:
        return self.main.tables

    @property
    def refs(self) -> list[int]:
        return self.main.refs

    @property
    def free(self) -> list[int]:
        return self.main.free

    @property
    def capacity(self) -> int:
        return self.main.capacity

    # --- sequences ----------------------------------------------------------------------------------------------
    def fork(self, row: int, copies: int = 1) -> list[int]:
        """Append ``copies`` sequences that share row ``row``'s blocks (parallel samples of one prompt); returns
        their row indices. The next forward pass must have the new number of rows."""
        first = len(self.main.tables)
        for group in self.groups.values():
            group.set_tables([list(t) for t in group.tables] + [list(group.tables[row]) for _ in range(copies)])
        return list(range(first, first + copies))

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Row i becomes old row beam_idx[i] by sharing its blocks (beam search; may change the number of rows)."""
        order = beam_idx.tolist()
        for group in self.groups.values():
            group.set_tables([list(group.tables[i]) for i in order])

    def batch_repeat_interleave(self, repeats: int) -> None:
        for group in self.groups.values():
            group.set_tables([list(t) for t in group.tables for _ in range(repeats)])

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(torch.arange(len(self.main.tables))[indices])

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions of every row (negative, as DynamicCache.crop); blocks no
        longer needed go back to the free list once no sequence holds them. A sliding group cannot grow back the
        positions its window has given back (RuntimeError, as ``DynamicSlidingWindowLayer``)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to drop (as DynamicCache.crop)")
        for group in self.groups.values():
            group.crop(tokens_to_remove)

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
        for group in self.groups.values():
            group.set_tables([])

    # --- what it holds ------------------------------------------------------------------------------------------
    def blocks(self) -> KVBlocks:
        """The main group's block tables, shared blocks and fragmentation (``BlockGroup.blocks``)."""
        return self.main.blocks()

    def paged_layers(self) -> list[PagedLayer]:
        """``layers``, as what they are here (transformers types them as its own layer classes)."""
        return cast(list[PagedLayer], self.layers)

    def layer_bytes(self) -> tuple[int, ...]:
        """Per layer: bytes of the blocks sequences hold in its group (their unused slots included), less those
        reused from another run's prefix (that run, or the shared pool's index, holds them)."""
        held = {id(group): len(group.held() - group.rows.reused) for group in self.groups.values()}
        return tuple(held[id(layer.group)] * self.block_size * layer.slot_bytes() for layer in self.paged_layers())

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks sequences hold, all layers, keys and values (each shared block once)."""
        return sum(self.layer_bytes())

    @property
    def used_bytes(self) -> int:
        """Bytes of the slots that hold a position a later pass can read (``nbytes`` less the unused slots)."""
        return sum(group.blocks().slots_used * group.slot_bytes() for group in self.groups.values())

    @property
    def reserved_bytes(self) -> int:
        """Bytes of the whole pools, free blocks included (what the process has allocated for the cache; a shared
        pool's, for every cache on it)."""
        return sum(group.capacity * self.block_size * group.slot_bytes() for group in self.groups.values())
