"""What a ``kv-cache`` run adds when its cache keeps less (``--kv-keep``, the KIVI dtypes) or records attention:
the cache, the attention tap feeding H2O and the attention view, the positions evicted per step, and the quality
against the full cache (teacher-forced KL and top-1 agreement)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from playground.config import KVSettings
from playground.engine.forward import keep_last_logits
from playground.engine.kv.attention_tap import AttentionTap, tapped
from playground.engine.kv.compressed import CompressedCache, evicting_cache, kivi_cache
from playground.events.kv import KVQuality
from playground.models.loaded import LoadedModel


def new_compressed_cache(lm: LoadedModel, kv: KVSettings) -> CompressedCache:
    if kv.kv_keep != "all":
        return evicting_cache(lm.model.config, kv.kv_keep, kv.kv_sinks, kv.kv_window, kv.kv_budget)
    return kivi_cache(lm.model.config, kv.kv_dtype, kv.kivi_group, kv.kivi_residual)


def attention_tap(kv: KVSettings, cache: Any) -> AttentionTap | None:
    """The tap the run needs: H2O scores every query row of every pass; the view records the last row."""
    if kv.kv_keep != "h2o" and not kv.record_attention:
        return None
    tap = AttentionTap(all_rows=kv.kv_keep == "h2o", record=kv.record_attention)
    if kv.kv_keep == "h2o":
        tap.consumers.append(cache.observe)
    return tap


def tapping(model: Any, tap: AttentionTap | None) -> AbstractContextManager[Any]:  # a transformers model
    return nullcontext() if tap is None else tapped(model, tap)


class EvictionTracker:
    """Positions that no layer or head holds any more, reported once, at the step they went."""

    def __init__(self) -> None:
        self.gone: set[int] = set()

    def newly_evicted(self, cache: Any) -> tuple[int, ...]:
        held_positions = getattr(cache, "held_positions", None)
        if held_positions is None:
            return ()
        held = held_positions()
        gone = set((~held).nonzero().flatten().tolist()) - self.gone
        self.gone |= gone
        return tuple(sorted(gone))


def kv_quality(lm: LoadedModel, prompt_ids: list[int], generated: list[int], logprobs: list[torch.Tensor],
               first_divergence: int) -> KVQuality:
    """The full cache's next-token distributions after the same prefixes as the run's (one forward pass over the
    prompt and the run's tokens but the last), against the run's own ``logprobs`` (per step, [vocab])."""
    n = len(logprobs)
    ids = torch.tensor([prompt_ids + generated[: n - 1]], device=lm.device)
    with torch.inference_mode():
        logits = lm.model(input_ids=ids, use_cache=False, **keep_last_logits(lm.model, n)).logits[0, -n:].float()
    full = logits.log_softmax(dim=-1)  # [n, vocab]
    mine = torch.stack(logprobs).to(full.device)  # [n, vocab]
    kl = (full.exp() * (full - mine)).sum(dim=-1).clamp_min(0.0)  # KL(full ‖ mine) per token
    agree = full.argmax(dim=-1) == mine.argmax(dim=-1)
    kls = tuple(float(x) for x in kl.tolist())
    agrees = tuple(bool(x) for x in agree.tolist())
    return KVQuality(kl=kls, top1_agree=agrees, first_divergence=first_divergence,
                     mean_kl=sum(kls) / n if n else 0.0, agreement=sum(agrees) / n if n else 0.0)
