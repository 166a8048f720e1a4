"""KV-cache settings: how the cache is held (contiguous, paged, none, quantized), the attention implementation,
and the measurements a KV-cache run makes."""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.catalog import Strategy, register_strategy
from playground.config.groups import SettingsGroup, register_group
from playground.config.table import setting
from playground.events import TokenStep
from playground.events.kv import KVStep

KV_DTYPES = ("model", "int8", "int4")
ATTENTIONS = ("model", "sdpa", "eager")


@register_group
@dataclass(frozen=True)
class KVSettings(SettingsGroup):
    name = "kv"
    title = "KV cache"
    order = 50

    no_cache: bool = setting(False, "no cache", "recompute the whole sequence every step instead of keeping keys "
                             "and values (same tokens, quadratic cost)")
    paged: bool = setting(False, "paged cache", "hold the cache as fixed-size blocks with a block table, as vLLM's "
                          "PagedAttention does, instead of one growing tensor per layer")
    block_size: int = setting(16, "block size", "paged cache: tokens per block", minimum=1, maximum=256)
    kv_dtype: str = setting("model", "KV dtype", "store keys and values in the model's dtype, or quantized to int8 / "
                            "int4 (per-token scales)", choices=KV_DTYPES)
    attn: str = setting("model", "attention", "attention implementation: the model's own (sdpa for most families, "
                        "eager for Gemma 2), sdpa (PyTorch's scaled-dot-product attention) or eager (the explicit "
                        "softmax(QKᵀ)V)", choices=ATTENTIONS)
    samples: int = setting(1, "parallel samples", "decode this many sampled continuations of the prompt as one "
                           "batch sharing its prefill (paged: the prompt's blocks shared, copied on write; "
                           "contiguous: a copy per sequence); 1 = one greedy sequence", minimum=1, maximum=16)
    compare_no_cache: bool = setting(True, "compare without cache", "after the run, decode the same prompt "
                                     "recomputing everything each step, for per-token latency with and without "
                                     "the cache")
    batch_sweep: str = setting("", "batch sweep", "after the run, decode this many copies of the prompt as one batch "
                               "each (e.g. 1,2,4,8,16,32) and measure throughput and per-token latency; empty: skip")

    def summary(self) -> str:
        holder = "no cache" if self.no_cache else (f"paged ({self.block_size}-token blocks)" if self.paged
                                                    else "contiguous cache")
        samples = f" · {self.samples} samples" if self.samples > 1 else ""
        attention = "model's attention" if self.attn == "model" else self.attn
        return f"{holder} · KV {self.kv_dtype} · {attention}{samples}"

    def cross_checks(self) -> list[tuple[bool, str]]:
        try:
            sizes = self.sweep_sizes()
            sweep_ok, why = all(1 <= n <= 64 for n in sizes), "batch sizes must be between 1 and 64"
        except ValueError:
            sweep_ok, why = False, f"batch_sweep must be batch sizes separated by commas, such as 1,2,4,8 (got " \
                                   f"{self.batch_sweep!r})"
        return [
            (not (self.no_cache and self.paged), "--no-cache and --paged exclude each other: a paged cache is a cache"),
            (not (self.no_cache and self.kv_dtype != "model"), "--kv-dtype quantizes a cache: it needs one "
                                                               "(drop --no-cache)"),
            (sweep_ok, why),
        ]

    def sweep_sizes(self) -> tuple[int, ...]:
        return tuple(int(part) for part in self.batch_sweep.replace(" ", "").split(",") if part)


register_strategy(Strategy(
    "kv-cache", "greedy decoding that measures its KV cache every step: contiguous, paged, quantized or none",
    sections=("sampling", "penalties"), groups=(KVSettings,), step_events=(KVStep, TokenStep),
    runner="playground.engine.kv.decode:run_kv_cache", order=70))
