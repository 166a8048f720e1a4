"""KV-cache events: what the cache holds after every step (per layer, measured), the two phases of decoding
against the machine's measured ceilings, the paged cache's blocks, and the comparisons a KV-cache run measures.

A ``kv-cache`` run yields ``KVStarted`` after ``start``, a ``KVStep`` right before each ``token`` event (same
``step``; index 0 of per-layer tuples is the first decoder layer), a ``KVPhase`` for the prefill and one for the
decode phase, and — when asked — ``KVCompare`` (with vs without cache) and ``KVSweep`` (batch sizes) before ``done``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class KVStarted:
    """How the cache is held, and the numbers its formula needs."""

    type: ClassVar[str] = "kv_start"
    holder: str  # "contiguous" | "paged" | "none"
    block_size: int  # paged: tokens per block (0 otherwise)
    kv_dtype: str  # "model" | "int4" | "int2" (KIVI) | "int8" | "int4-per-token" (per-token codes)
    attn: str  # "sdpa" | "eager"
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_element: float  # of the stored keys/values (0.5 for int4; scales counted in the measured bytes)
    formula_bytes_per_token: float  # 2 × layers × kv_heads × head_dim × bytes per element
    weights_bytes: int  # the model's parameters and buffers
    max_length: int  # prompt + max new tokens: what a contiguous cache reserved up front would hold
    peak_flops: float  # this machine's measured ceilings (matmul and copy probes), for the roofline
    peak_bytes_per_s: float
    sequences: int = 1  # parallel samples decoded as one batch on the prompt's shared prefill
    keep: str = "all"  # which positions the cache keeps: "all" | "sinks" (StreamingLLM) | "h2o" (heavy hitters)
    sinks: int = 0  # sinks: the first positions kept
    window: int = 0  # sinks / h2o: the newest positions kept
    budget: int = 0  # h2o: positions kept per layer and head
    kivi_group: int = 0  # KIVI dtypes: tokens per key group
    kivi_residual: int = 0  # KIVI dtypes: newest tokens in full precision

    def __post_init__(self) -> None:
        # Saved runs' older names: "kivi-int4" / "kivi-int2" were KIVI's; "int4" without a KIVI group was the
        # per-token cache's, before KIVI took the name.
        renamed = {"kivi-int4": "int4", "kivi-int2": "int2"}.get(self.kv_dtype)
        if renamed is None and self.kv_dtype == "int4" and self.kivi_group == 0:
            renamed = "int4-per-token"
        if renamed is not None:
            object.__setattr__(self, "kv_dtype", renamed)


@dataclass(frozen=True)
class KVBlocks:
    """The paged cache after a step: every sequence's block table."""

    tables: tuple[tuple[int, ...], ...]  # per sequence: block ids, in order
    shared: tuple[int, ...]  # block ids referenced by more than one sequence
    blocks_allocated: int
    slots_allocated: int  # token positions the allocated blocks can hold (blocks × block size), per layer
    slots_used: int  # token positions held
    fragmentation: float  # 1 − used / allocated
    reused: tuple[int, ...] = ()  # block ids of the prompt's prefix written by another run (prefix sharing)


@dataclass(frozen=True)
class KVStep:
    """The cache after one decoding step."""

    type: ClassVar[str] = "kv"
    step: int  # the step of the ``token`` event that follows
    tokens: int  # positions held per sequence
    layer_bytes: tuple[int, ...]  # measured bytes of each layer's keys and values (and scales)
    total_bytes: int  # sum of layer_bytes (the token event's kv_cache_bytes)
    formula_bytes: int  # 2 × layers × kv_heads × head_dim × tokens × bytes per element × sequences
    process_bytes: int  # resident memory of the process (CPU) or allocated device memory (CUDA)
    device_reserved_bytes: int  # CUDA: reserved by the caching allocator; 0 elsewhere
    blocks: KVBlocks | None  # paged cache only
    evicted: tuple[int, ...] = ()  # positions no layer or head holds any more since this step (evicting caches)


@dataclass(frozen=True)
class KVPhase:
    """One phase of the run on the roofline: measured time, estimated work and traffic."""

    type: ClassVar[str] = "kv_phase"
    phase: str  # "prefill" | "decode"
    tokens: int  # prompt tokens read, or tokens decoded
    ms: float
    flops: float  # estimated: 2 × parameters × tokens + attention
    bytes_moved: float  # estimated: weights read once per forward pass + KV read/written
    intensity: float  # flops / bytes
    achieved_flops: float  # flops / time


@dataclass(frozen=True)
class KVCompare:
    """The same prompt and tokens decoded with and without the cache: per-token latency of each."""

    type: ClassVar[str] = "kv_compare"
    cached_ms: tuple[float, ...]  # per generated token
    uncached_ms: tuple[float, ...]
    identical: bool  # the recomputed run chose the same tokens


@dataclass(frozen=True)
class KVSweep:
    """N copies of the prompt decoded as one batch, for each N."""

    type: ClassVar[str] = "kv_sweep"
    batch_sizes: tuple[int, ...]
    tokens_per_s: tuple[float, ...]  # all sequences together
    ms_per_step: tuple[float, ...]  # one decoding step of the whole batch (each sequence's per-token latency)
    kv_bytes: tuple[int, ...]  # the cache at the end of each


@dataclass(frozen=True)
class KVQuality:
    """A cache that keeps less, against the full cache on the same prompt. Teacher-forced: both read this run's
    own tokens, so step i compares the two next-token distributions after the same prefix (raw model output)."""

    type: ClassVar[str] = "kv_quality"
    kl: tuple[float, ...]  # per generated token: KL(full cache ‖ this cache), nats
    top1_agree: tuple[bool, ...]  # per generated token: both put the same token first
    first_divergence: int  # greedy: the first token where the full cache's own greedy output differs (−1: none)
    mean_kl: float
    agreement: float  # share of top1_agree
