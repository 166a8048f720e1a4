"""A KV cache that stores keys and values as int8 or int4 (two codes per byte), dequantized when attention reads them.

Quantization is per token and per head: every head_dim vector gets its own step and offset (asymmetric: the codes
0 .. 2^bits − 1 span [min, max] of that vector), so one outlier token spoils only itself, and a cache can be
appended to, cropped and reordered by whole tokens without re-quantizing anything. Asymmetric costs a second
float per vector (4 more bytes) but uses all 16 int4 levels on vectors that are not centred on zero (symmetric
would waste up to half of them). Step and offset are float32: rounding them to fp16 would add an error comparable
to an int8 step. So a stored vector of ``head_dim`` values takes ``head_dim × bits / 8 + 8`` bytes.

What attention reads is exactly what the cache holds: every position, including the ones written by the current
forward pass, is read back dequantized. transformers' ``QuantizedCache`` instead hands the current chunk to
attention in full precision and keeps ``residual_length=128`` recent tokens unquantized (KIVI quantizes keys per
channel and needs a group of tokens before it can). Per-token scales need no such group, and a 128-token window
would leave a short chat entirely unquantized (no saving to show, nothing to diverge), so ``residual_length``
defaults to 0 here; set it to imitate transformers. With 0, attention sees the stored codes whether a token came
in a prefill or one at a time (transformers' choice gives a prefill's own tokens full precision, so the two
differ), and ``crop`` leaves exactly the codes a run of the kept tokens alone would have stored.

The price of per-token scales: a key vector's few outlier channels (on SmolLM2 ~5.5× the median channel) set its
step, so int4 keys lose ~13% (relative L2) and greedy output drifts within a few tokens; KIVI quantizes keys per
channel for this reason (``benchmarks/bench_kv_paged.py`` prints where outputs diverge).

A sliding-window layer (Mistral, Gemma 2 / 3's local layers) keeps only what its window can still read, as
transformers' ``DynamicSlidingWindowLayer`` does: a forward pass reads the newest ``window − 1`` stored positions and
its own, and afterwards the layer drops all but the newest ``window − 1``. Full-attention layers keep everything.

The maths (``quantize``, ``dequantize``, ``pack_int4``) is shared with the paged cache, which stores the same codes
in blocks.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from playground.models.anatomy import SLIDING, kv_layout

KV_BITS = {"int8": 8, "int4": 4}
PARAMS_BYTES = 8  # per stored vector: step and offset, float32


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte, the even element in the low nibble: [..., d] uint8 in 0..15 -> [..., d / 2]."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """[..., d / 2] uint8 -> [..., d] codes in 0..15 (the inverse of ``pack_int4``)."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)


def quantize(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., d] -> (codes uint8 [..., d × bits / 8], params float32 [..., 2] = (step, offset)).

    x ≈ code × step + offset, with the error of each element at most step / 2 (round to nearest)."""
    if bits == 4 and x.shape[-1] % 2:
        raise ValueError(f"int4 packs two codes per byte: head_dim must be even (got {x.shape[-1]})")
    levels = (1 << bits) - 1
    xf = x.float()
    low = xf.amin(dim=-1, keepdim=True)  # [..., 1]
    step = (xf.amax(dim=-1, keepdim=True) - low) / levels
    step = torch.where(step > 0, step, torch.ones_like(step))  # a constant vector: every code is 0, any step works
    codes = ((xf - low) / step).round_().clamp_(0, levels).to(torch.uint8)
    if bits == 4:
        codes = pack_int4(codes)
    return codes, torch.cat((step, low), dim=-1)


def dequantize(codes: torch.Tensor, params: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of ``quantize`` (up to the rounding): [..., d × bits / 8] codes, [..., 2] params -> [..., d]."""
    if bits == 4:
        codes = unpack_int4(codes)
    return torch.addcmul(params[..., 1:], codes.float(), params[..., :1]).to(dtype)


def encode_kv(x: torch.Tensor, kv_dtype: str) -> tuple[torch.Tensor, ...]:
    """The stored parts of keys or values [..., d]: (x,) in the model's dtype, or (codes, params)."""
    return (x,) if kv_dtype == "model" else quantize(x, KV_BITS[kv_dtype])


def decode_kv(parts: tuple[torch.Tensor, ...], kv_dtype: str, dtype: torch.dtype) -> torch.Tensor:
    return parts[0] if kv_dtype == "model" else dequantize(parts[0], parts[1], KV_BITS[kv_dtype], dtype)


def part_shapes(kv_dtype: str, head_dim: int, dtype: torch.dtype) -> tuple[tuple[int, torch.dtype], ...]:
    """(last dimension, dtype) of each stored part, for caches that allocate storage before writing."""
    if kv_dtype == "model":
        return ((head_dim, dtype),)
    return ((head_dim * KV_BITS[kv_dtype] // 8, torch.uint8), (2, torch.float32))


def stored_bytes_per_vector(kv_dtype: str, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one head's key (or value) of one token takes: head_dim × bytes per element, or codes + params."""
    return sum(size * torch.empty((), dtype=d).element_size() for size, d in part_shapes(kv_dtype, head_dim, dtype))


def _nbytes(tensors: tuple[torch.Tensor | None, ...]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class QuantizedKVLayer(CacheLayerMixin):
    """One layer's keys and values: quantized parts [batch, kv_heads, seq, ·] and a full-precision residual tail.

    ``window``: a sliding-window layer's window (it then holds the newest ``window − 1`` positions between passes);
    None for full attention."""

    is_compileable = False
    is_croppable = True
    # [b, h, r, d] the newest r ≤ residual_length tokens, unquantized; set by lazy_initialization before anything
    # reads them (None before: is_initialized is False).
    key_tail: torch.Tensor
    value_tail: torch.Tensor

    def __init__(self, kv_dtype: str, residual_length: int = 0, window: int | None = None) -> None:
        # CacheLayerMixin.__init__ would assign ``keys``/``values``, which are read-only views here.
        if window is not None and window < 1:
            raise ValueError(f"a sliding window must be >= 1 token (got {window})")
        self.kv_dtype, self.residual_length, self.window = kv_dtype, residual_length, window
        self.is_sliding = window is not None  # read by transformers' masks: which layer's sizes the sliding mask uses
        self.reset()

    def reset(self) -> None:
        self.is_initialized = False
        self.cumulative_length = 0  # positions fed so far (a sliding layer holds only the newest of them)
        self.key_parts: tuple[torch.Tensor, ...] = ()  # (codes [b, h, t, d·bits/8], params [b, h, t, 2])
        self.value_parts: tuple[torch.Tensor, ...] = ()
        self.key_tail = self.value_tail = None  # type: ignore[assignment]  # until the first update

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        empty = key_states[:, :, :0, :]  # [b, h, 0, d]
        self.key_parts = self.value_parts = encode_kv(empty, self.kv_dtype)
        self.key_tail, self.value_tail = empty.clone(), value_states[:, :, :0, :].clone()
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states, value_states: [b, h, q, d]; returns everything held, dequantized: [b, h, seq, d]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        key_tail = torch.cat((self.key_tail, key_states), dim=-2)
        value_tail = torch.cat((self.value_tail, value_states), dim=-2)
        spill = key_tail.shape[-2] - self.residual_length  # the oldest tokens beyond the window get quantized
        if spill > 0:
            self.key_parts = self._append(self.key_parts, key_tail[:, :, :spill])
            self.value_parts = self._append(self.value_parts, value_tail[:, :, :spill])
            key_tail, value_tail = key_tail[:, :, spill:], value_tail[:, :, spill:]
        self.key_tail, self.value_tail = key_tail, value_tail
        # The pass reads everything held, its own positions included (initialized by now: never None).
        keys, values = cast(torch.Tensor, self.keys), cast(torch.Tensor, self.values)
        if self.window is not None:
            self._keep_newest(self.window - 1)
        return keys, values

    def _held(self) -> int:
        return self.quantized_length + self.key_tail.shape[-2] if self.is_initialized else 0

    def _keep_newest(self, keep: int) -> None:
        """Drop all but the newest ``keep`` held positions (the oldest quantized ones first, then the tail's)."""
        drop = self._held() - keep
        if drop <= 0:
            return
        quantized = min(drop, self.quantized_length)
        self.key_parts = tuple(p[:, :, quantized:] for p in self.key_parts)
        self.value_parts = tuple(p[:, :, quantized:] for p in self.value_parts)
        self.key_tail, self.value_tail = (t[:, :, drop - quantized:] for t in (self.key_tail, self.value_tail))

    def _append(self, parts: tuple[torch.Tensor, ...], states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        new = encode_kv(states, self.kv_dtype)
        return tuple(torch.cat((old, part), dim=-2) for old, part in zip(parts, new, strict=True))

    @property  # the base's attribute, a read-only view here (see __init__)
    def keys(self) -> torch.Tensor | None:  # type: ignore[override]  # [b, h, seq, d], dequantized
        if not self.is_initialized:
            return None
        return torch.cat((decode_kv(self.key_parts, self.kv_dtype, self.dtype), self.key_tail), dim=-2)

    @property  # the base's attribute, a read-only view here (see __init__)
    def values(self) -> torch.Tensor | None:  # type: ignore[override]  # [b, h, seq, d], dequantized
        if not self.is_initialized:
            return None
        return torch.cat((decode_kv(self.value_parts, self.kv_dtype, self.dtype), self.value_tail), dim=-2)

    @property
    def quantized_length(self) -> int:
        return self.key_parts[0].shape[-2] if self.is_initialized else 0

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) of the keys the next pass reads: everything, or on a sliding layer the newest
        ``window − 1`` held positions from ``kv_offset`` on (as ``DynamicSlidingWindowLayer``)."""
        held = self._held()
        return held + query_length, self.cumulative_length - held

    def get_max_length(self) -> int:
        return self.window if self.window is not None else -1

    @property
    def nbytes(self) -> int:
        """Bytes truly held: integer codes, float32 step and offset per vector, and the unquantized tail."""
        return _nbytes((*self.key_parts, *self.value_parts, self.key_tail, self.value_tail))

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to drop (as DynamicCache.crop)")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        length = max(self.cumulative_length + tokens_to_remove, 0)
        held = self._held()
        first = self.cumulative_length - held  # the oldest position still held
        if self.window is not None and first > max(length - self.window + 1, 0):
            raise RuntimeError(f"cannot crop this sliding-window layer back to {length} positions: its window "
                               f"({self.window}) has already dropped positions before {first}, which that length "
                               f"would read again")
        keep = length - first
        quantized = min(keep, self.quantized_length)
        self.key_parts = tuple(p[:, :, :quantized] for p in self.key_parts)
        self.value_parts = tuple(p[:, :, :quantized] for p in self.value_parts)
        self.key_tail, self.value_tail = (t[:, :, : keep - quantized] for t in (self.key_tail, self.value_tail))
        self.cumulative_length = length

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Row i becomes old row beam_idx[i] (codes move as they are: no lossy round trip)."""
        if not self.is_initialized:
            return
        idx = beam_idx.to(self.device)
        self.key_parts = tuple(p.index_select(0, idx) for p in self.key_parts)
        self.value_parts = tuple(p.index_select(0, idx) for p in self.value_parts)
        self.key_tail, self.value_tail = self.key_tail.index_select(0, idx), self.value_tail.index_select(0, idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            rows = self.key_tail.shape[0]
            self.reorder_cache(torch.arange(rows, device=self.device).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.reorder_cache(torch.arange(self.key_tail.shape[0], device=self.device)[indices])


class QuantizedKVCache(Cache):
    """A transformers ``Cache`` whose layers store int8 or int4 keys and values (per-token, per-head scales).

    ``QuantizedKVCache(model.config, kv_dtype="int8")``; pass it as ``cache=`` to the model's forward.
    ``nbytes`` / ``layer_bytes()`` are the bytes truly held (codes + scales + unquantized tail)."""

    def __init__(self, config: Any, kv_dtype: str = "int8", residual_length: int = 0) -> None:
        if kv_dtype not in KV_BITS:
            raise ValueError(f"kv_dtype must be one of {sorted(KV_BITS)} (got {kv_dtype!r})")
        if residual_length < 0:
            raise ValueError(f"residual_length must be >= 0 (got {residual_length})")
        self.kv_dtype, self.residual_length = kv_dtype, residual_length
        layers: list[Any] = [QuantizedKVLayer(kv_dtype, residual_length, window) for window in layer_windows(config)]
        super().__init__(layers=layers)

    @property
    def nbytes(self) -> int:
        return sum(self.layer_bytes())

    def layer_bytes(self) -> tuple[int, ...]:
        return tuple(cast(QuantizedKVLayer, layer).nbytes for layer in self.layers)


def layer_windows(config: Any) -> tuple[int | None, ...]:
    """Per decoder layer: its sliding window, or None for a full-attention layer (``models.anatomy.kv_layout``,
    the layer types transformers' ``DynamicCache`` builds its layers from)."""
    layout = kv_layout(config)
    return tuple(window if kind == SLIDING else None
                 for kind, window in zip(layout.layer_types, layout.windows, strict=True))
