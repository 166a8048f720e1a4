"""KV-cache settings: how the cache is held (contiguous, paged, none, quantized), the attention implementation,
and the measurements a KV-cache run makes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from playground.config.catalog import Strategy, register_strategy
from playground.config.groups import SettingsGroup, register_group
from playground.config.table import setting
from playground.events import TokenStep
from playground.events.kv import KVStep

KV_DTYPES = ("model", "int4", "int2", "int8", "int4-per-token")
KIVI_BITS = {"int4": 4, "int2": 2}  # the quantized dtypes KIVI holds (keys per channel, values per token)
PER_TOKEN_DTYPES = {"int8": "int8", "int4-per-token": "int4"}  # per-token codes: the per-token cache's own names
RENAMED_KV_DTYPES = {"kivi-int4": "int4", "kivi-int2": "int2"}  # names saved runs may hold
# Every field a KV group had before the KIVI dtypes came: a saved run's group with all of them and no "kivi_group"
# was written then, when "int4" meant per-token codes (a preset's hand-written group names only what it changes).
FIELDS_BEFORE_KIVI = frozenset({"no_cache", "paged", "block_size", "kv_dtype", "attn", "samples",
                                "compare_no_cache", "batch_sweep"})
KV_KEEP = ("all", "sinks", "h2o")
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
    kv_dtype: str = setting("model", "KV dtype", "store keys and values in the model's dtype; int4 / int2: quantized "
                            "as KIVI does (keys per channel in groups of tokens, values per token, the newest tokens "
                            "in full precision); int8 / int4-per-token: every key and value vector with its own "
                            "scale (the paged cache's codes; int4 per-token keys lose their outlier channels)",
                            choices=KV_DTYPES)
    kivi_group: int = setting(32, "KIVI group", "KIVI: tokens per key group (each channel of a group gets its own "
                              "scale) and channels per value group", minimum=2, maximum=256)
    kivi_residual: int = setting(32, "KIVI residual", "KIVI: the newest tokens kept in full precision (a multiple "
                                 "of the group; keys are quantized this many at a time)", minimum=2, maximum=4096)
    kv_keep: str = setting("all", "KV keep", "which positions the cache keeps: all; sinks (StreamingLLM: the first "
                           "--kv-sinks and the newest --kv-window); h2o (heavy hitters: --kv-budget positions, the "
                           "newest --kv-window plus the most attended)", choices=KV_KEEP)
    kv_sinks: int = setting(4, "KV sinks", "sinks: the first positions always kept (attention sinks)", minimum=0,
                            maximum=4096)
    kv_window: int = setting(64, "KV window", "sinks and h2o: the newest positions always kept", minimum=1,
                             maximum=65536)
    kv_budget: int = setting(128, "KV budget", "h2o: positions kept per layer and head (recent window included)",
                             minimum=1, maximum=65536)
    record_attention: bool = setting(False, "record attention", "record each new token's attention row in every "
                                     "layer and head, for the attention view (costs a q·kᵀ row per layer)")
    attention_top: int = setting(16, "attention top", "recorded attention: the top positions kept per layer and "
                                 "head (the rest as one mass); 0 keeps every position (short runs)", minimum=0,
                                 maximum=65536)
    attn: str = setting("model", "attention", "attention implementation: the model's own (sdpa for most families, "
                        "eager for Gemma 2), sdpa (PyTorch's scaled-dot-product attention) or eager (the explicit "
                        "softmax(QKᵀ)V)", choices=ATTENTIONS)
    samples: int = setting(1, "parallel samples", "decode this many sampled continuations of the prompt as one "
                           "batch sharing its prefill (paged: the prompt's blocks shared, copied on write; "
                           "contiguous: a copy per sequence); 1 = one greedy sequence", minimum=1, maximum=16)
    prefix_blocks: int = setting(0, "prefix pool", "paged cache: share the prompt's full blocks across runs and "
                                 "side-by-side panes on this model (SGLang's radix idea): up to this many blocks "
                                 "stay indexed by their prefix for later runs, least recently used first out; a "
                                 "run whose prompt starts with the same tokens reads them instead of computing "
                                 "them; 0: no sharing", minimum=0, maximum=1_000_000)
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
        keep = {"all": "", "sinks": f" · keep {self.kv_sinks} sinks + {self.kv_window} newest",
                "h2o": f" · keep {self.kv_budget} (H2O, {self.kv_window} newest)"}[self.kv_keep]
        return f"{holder} · KV {self.kv_dtype}{keep} · {attention}{samples}"

    @classmethod
    def from_plain_dict(cls, plain: dict[str, Any]) -> tuple[KVSettings, list[str]]:
        """Saved runs' older names: kivi-int4 / kivi-int2 are int4 / int2, and a group saved before KIVI came
        (every field of then, none of KIVI's) meant per-token codes by int4."""
        dtype = plain.get("kv_dtype")
        if dtype in RENAMED_KV_DTYPES:
            plain = {**plain, "kv_dtype": RENAMED_KV_DTYPES[dtype]}
        elif dtype == "int4" and set(plain) >= FIELDS_BEFORE_KIVI and "kivi_group" not in plain:
            plain = {**plain, "kv_dtype": "int4-per-token"}
        return super().from_plain_dict(plain)

    def kivi(self) -> bool:
        """Whether the cache is KIVI's (int4, int2)."""
        return self.kv_dtype in KIVI_BITS

    def compressed(self) -> bool:
        """Whether the cache keeps less than every position in the model's dtype (quality measured after)."""
        return self.kv_keep != "all" or self.kivi()

    def cross_checks(self) -> list[tuple[bool, str]]:
        try:
            sizes = self.sweep_sizes()
            sweep_ok, why = all(1 <= n <= 64 for n in sizes), "batch sizes must be between 1 and 64"
        except ValueError:
            sweep_ok, why = False, f"batch_sweep must be batch sizes separated by commas, such as 1,2,4,8 (got " \
                                   f"{self.batch_sweep!r})"
        return [
            (not (self.no_cache and self.paged), "--no-cache and --paged exclude each other: a paged cache is a cache"),
            (not (self.prefix_blocks and not self.paged), "--prefix-blocks shares the paged cache's blocks "
                                                           "across runs: add --paged"),
            (not (self.no_cache and self.kv_dtype != "model"), "--kv-dtype quantizes a cache: it needs one "
                                                               "(drop --no-cache)"),
            (sweep_ok, why),
            (not (self.kv_keep != "all" and self.kv_dtype != "model"), "--kv-keep evicts positions of a cache in the "
             "model's dtype: combine it with --kv-dtype model"),
            (not (self.kivi() and self.paged), f"--paged stores each token's keys and values with their own scale "
             f"in its blocks, and KIVI's keys are quantized per channel over groups of tokens that would straddle "
             f"blocks: use --kv-dtype int4-per-token or int8 with --paged, or --kv-dtype {self.kv_dtype} without it"),
            (not (self.kv_keep != "all" and (self.paged or self.no_cache or self.samples > 1)),
             "--kv-keep evicts from a contiguous cache of one sequence: drop --paged, --no-cache and --samples"),
            (not (self.kivi() and self.samples > 1), f"--kv-dtype {self.kv_dtype} (KIVI) holds one sequence: drop "
             "--samples, or use --kv-dtype int4-per-token or int8 for parallel samples"),
            (not (self.kv_keep == "h2o" and self.kv_window >= self.kv_budget), "--kv-keep h2o keeps --kv-window "
             "recent positions inside --kv-budget: the window must be smaller than the budget"),
            (not (self.kivi() and self.kivi_residual % self.kivi_group),
             "--kivi-residual must be a multiple of --kivi-group (keys are quantized a group of tokens at a time)"),
        ]

    def sweep_sizes(self) -> tuple[int, ...]:
        return tuple(int(part) for part in self.batch_sweep.replace(" ", "").split(",") if part)


register_strategy(Strategy(
    "kv-cache", "greedy decoding that measures its KV cache every step: contiguous, paged, quantized or none",
    sections=("sampling", "penalties"), groups=(KVSettings,), step_events=(KVStep, TokenStep),
    runner="playground.engine.kv.decode:run_kv_cache", records_itself=("kv",), order=70))
