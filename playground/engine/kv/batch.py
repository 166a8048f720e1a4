"""Decoding with and without the cache, many prompts as one batch, and attention implementations side by side:
the timed runs behind ``KVCompare``, ``KVSweep`` and the attention comparison. Greedy throughout, pure PyTorch.

Every step is timed the same way: the forward pass and the argmax, with the device synchronised before the clock
stops. Runs decode a fixed number of tokens unless told which ids stop them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import statistics
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from transformers import DynamicCache

from playground.engine.forward import keep_last_logits, sync_device
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.run_context import NO_CONTEXT, RunContext
from playground.models.loaded import LoadedModel


def _timed(device: torch.device, call: Callable[..., torch.Tensor], *args: Any) -> tuple[torch.Tensor, float]:
    """(result, milliseconds) of ``call(*args)`` with the device's queued work waited for."""
    sync_device(device)
    start = time.perf_counter()
    result = call(*args)
    sync_device(device)
    return result, (time.perf_counter() - start) * 1000


def _greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, :].argmax(dim=-1)  # logits: [batch, positions, vocab] -> [batch]


def cached_decode(lm: LoadedModel, prompt_ids: Sequence[int], tokens: int, stop_ids: Collection[int] = (),
                  context: RunContext = NO_CONTEXT) -> tuple[list[int], list[float]]:
    """Greedy with a ``DynamicCache``: the first token from one pass over the prompt, each later one from a pass over
    the previous token alone. Returns the new ids and each one's milliseconds (index 0: the prompt pass); fewer
    when the context's Stop (polled before each pass) stopped it."""
    model, extra = lm.model, keep_last_logits(lm.model, 1)
    ids = torch.tensor([list(prompt_ids)], device=lm.device)  # [1, prompt_len]
    cache = DynamicCache(config=model.config)
    chosen: list[int] = []
    times: list[float] = []
    with torch.inference_mode():
        for _ in range(tokens):
            if context.stopped():
                break
            step_input = ids if not chosen else ids[:, -1:]
            token, ms = _timed(lm.device, lambda x: _greedy(
                model(input_ids=x, cache=cache, use_cache=True, **extra).logits), step_input)
            chosen.append(int(token.item()))
            times.append(ms)
            ids = torch.cat([ids, token[:, None]], dim=1)
            if chosen[-1] in stop_ids:
                break
    return chosen, times


def no_cache_decode(lm: LoadedModel, prompt_ids: Sequence[int], tokens: int, stop_ids: Collection[int] = (),
                    context: RunContext = NO_CONTEXT) -> tuple[list[int], list[float]]:
    """Greedy without a cache: every step runs the whole sequence so far (prompt + tokens chosen) through the model
    again. Same tokens as ``cached_decode``, quadratic cost. Returns the new ids and each one's milliseconds; fewer
    when the context's Stop (polled before each pass) stopped it."""
    model, extra = lm.model, keep_last_logits(lm.model, 1)
    ids = torch.tensor([list(prompt_ids)], device=lm.device)  # [1, prompt_len + step]
    chosen: list[int] = []
    times: list[float] = []
    with torch.inference_mode():
        for _ in range(tokens):
            if context.stopped():
                break
            token, ms = _timed(lm.device, lambda x: _greedy(model(input_ids=x, use_cache=False, **extra).logits), ids)
            chosen.append(int(token.item()))
            times.append(ms)
            ids = torch.cat([ids, token[:, None]], dim=1)
            if chosen[-1] in stop_ids:
                break
    return chosen, times


# ---------------------------------------------------------------------------------------------------------------
# Batches: several prompts, left-padded, one cache.


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prompts as one [batch, longest] tensor padded on the left, and its attention mask (1 = real token; None when
    all prompts have the same length)."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        if prompt:
            ids[row, longest - len(prompt):] = torch.tensor(list(prompt), device=device)
            mask[row, longest - len(prompt):] = 1
    return ids, (None if bool(mask.all()) else mask)


@dataclass
class BatchRun:
    tokens: list[list[int]]  # per prompt: the new ids
    prefill_ms: float  # the pass over all the (padded) prompts, which chooses every row's first token
    step_ms: list[float]  # each later step: one token for every row
    kv_bytes: int  # the cache at the end (padding positions included)


def _pad_id(lm: LoadedModel) -> int:
    pad = getattr(lm.tokenizer, "pad_token_id", None)
    if pad is None:
        pad = lm.eos_token_ids[0] if lm.eos_token_ids else 0
    return int(pad)


def batch_greedy(lm: LoadedModel, prompts: Sequence[Sequence[int]], new_tokens: int,
                 context: RunContext = NO_CONTEXT) -> BatchRun:
    """Greedy decoding of all ``prompts`` as one batch with one ``DynamicCache``: left padding with an attention
    mask, and positions counted from each row's first real token (as ``generate`` does), so every row chooses the
    tokens it would alone. Every row decodes ``new_tokens`` tokens (no stop at EOS), fewer when the context's Stop
    (polled before each step after the prefill) stopped it."""
    if new_tokens < 1 or not prompts or not all(prompts):
        raise ValueError("batch_greedy needs at least one token to decode and non-empty prompts")
    model, extra = lm.model, keep_last_logits(lm.model, 1)
    ids, mask = left_pad(prompts, _pad_id(lm), lm.device)  # ids, mask: [batch, longest]
    positions = None if mask is None else (mask.cumsum(-1) - 1).clamp(min=0)  # [batch, longest]
    cache = DynamicCache(config=model.config)
    rows: list[list[int]] = [[] for _ in prompts]
    times: list[float] = []
    with torch.inference_mode():
        step_input = ids
        for _ in range(new_tokens):
            token, ms = _timed(lm.device, lambda x, m, p: _greedy(model(
                input_ids=x, attention_mask=m, position_ids=p, cache=cache, use_cache=True, **extra).logits),
                step_input, mask, positions)
            times.append(ms)
            for row, value in zip(rows, token.tolist(), strict=True):
                row.append(int(value))
            if len(rows[0]) == new_tokens or context.stopped():
                break
            step_input = token[:, None]  # [batch, 1]
            if mask is not None and positions is not None:
                mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], dim=1)
                positions = positions[:, -1:] + 1
    return BatchRun(tokens=rows, prefill_ms=times[0], step_ms=times[1:], kv_bytes=kv_cache_bytes(cache))


class SweepPoint(NamedTuple):
    size: int  # sequences in the batch
    tokens_per_s: float  # all sequences together: size / the median step time
    ms_per_step: float  # median decoding step of the whole batch (each sequence's per-token latency)
    kv_bytes: int  # the cache at the end


def batch_sweep(lm: LoadedModel, prompts: Sequence[Sequence[int]], sizes: Sequence[int], new_tokens: int,
                context: RunContext = NO_CONTEXT) -> list[SweepPoint]:
    """For each size N, decode N prompts as one batch (``prompts`` taken in turn: one prompt gives N copies,
    several give different, left-padded prompts) and time the steps after the prefill (the median, which a busy
    machine disturbs least). When the context's Stop stops it, the sizes measured in full before are returned."""
    if new_tokens < 2:
        raise ValueError("a sweep needs new_tokens >= 2: the first token comes from the prefill, not a step")
    points = []
    for size in sizes:
        if context.stopped():
            break
        run = batch_greedy(lm, [prompts[i % len(prompts)] for i in range(size)], new_tokens, context)
        if len(run.tokens[0]) < new_tokens:  # cut short: its steps are not the size's figure
            break
        ms = statistics.median(run.step_ms)
        points.append(SweepPoint(size=size, tokens_per_s=size * 1000 / ms, ms_per_step=ms, kv_bytes=run.kv_bytes))
    return points


# ---------------------------------------------------------------------------------------------------------------
# Attention implementations on one long prefill.


def _attention_variants(device: torch.device) -> list[tuple[str, str, Any, str]]:
    """(name, attn_implementation, forced SDPA backend or None, why it is unavailable or "")."""
    from torch.nn.attention import SDPBackend

    flash2 = ""
    if device.type != "cuda":
        flash2 = "FlashAttention-2 needs a CUDA device"
    elif importlib.util.find_spec("flash_attn") is None:
        flash2 = "the flash_attn package is not installed"
    return [("eager", "eager", None, ""), ("sdpa", "sdpa", None, ""),
            ("sdpa-math", "sdpa", SDPBackend.MATH, ""), ("sdpa-flash", "sdpa", SDPBackend.FLASH_ATTENTION, ""),
            ("flash_attention_2", "flash_attention_2", None, flash2)]


def _peak_cpu_allocation(run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, int]:
    """(result, peak bytes) of torch's CPU allocations during ``run``, above what was allocated when it started:
    the running sum of the profiler's memory events (allocations and frees in time order)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = run()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    held = peak = 0
    for event in events:
        held += event.nbytes()
        peak = max(peak, held)
    return result, peak


def _peak_memory(device: torch.device, run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, int | None, str]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        result = run()
        torch.cuda.synchronize(device)
        return result, torch.cuda.max_memory_allocated(device) - base, \
            "peak CUDA allocation above what was allocated before (torch.cuda.max_memory_allocated)"
    if device.type == "cpu":
        result, peak = _peak_cpu_allocation(run)
        return result, peak, ("peak of torch's CPU tensor allocations during the pass, above those held before "
                              "(torch.profiler memory events; not RSS: the allocator and the OS may hold more)")
    return run(), None, f"not measured on {device.type}"


def attention_compare(lm: LoadedModel, prompt_len: int, repeats: int = 2, prompt_ids: Sequence[int] | None = None
                      ) -> dict[str, Any]:
    """One prefill of ``prompt_len`` tokens (``prompt_ids``, else a fixed pseudo-random sequence) under each
    attention implementation: eager (the explicit softmax(QKᵀ)V), sdpa with PyTorch's choice of kernel, sdpa forced
    to its math kernel and to its flash kernel, and FlashAttention-2 where the device and package allow. The first
    pass of each measures peak memory (and warms up), then ``repeats`` passes are timed. The model's own
    implementation is restored afterwards.

    Returns ``{"prompt_len", "device", "dtype", "memory_measure", "variants": {name: {"available", "why", "ms"
    (median), "runs_ms", "peak_bytes", "max_logit_diff" (against the first available variant)}}}``.
    """
    model, device = lm.model, lm.device
    if prompt_ids is None:
        generator = torch.Generator().manual_seed(0)
        prompt_ids = torch.randint(0, model.config.vocab_size, (prompt_len,), generator=generator).tolist()
    ids = torch.tensor([list(prompt_ids)[:prompt_len]], device=device)  # [1, prompt_len]
    extra = keep_last_logits(model, 1)
    original = model.config._attn_implementation
    variants: dict[str, dict[str, Any]] = {}
    reference: torch.Tensor | None = None
    measure = ""

    def prefill() -> torch.Tensor:
        cache = DynamicCache(config=model.config)
        return model(input_ids=ids, cache=cache, use_cache=True, **extra).logits[:, -1, :].float()  # [1, vocab]

    try:
        for name, implementation, backend, unavailable in _attention_variants(device):
            if unavailable:
                variants[name] = {"available": False, "why": unavailable}
                continue
            try:
                model.set_attn_implementation(implementation)
                kernel = torch.nn.attention.sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()
                with kernel, torch.inference_mode():
                    logits, peak, measure = _peak_memory(device, prefill)
                    runs = [_timed(device, prefill)[1] for _ in range(repeats)]
            except (RuntimeError, ImportError, ValueError) as error:
                variants[name] = {"available": False, "why": f"{type(error).__name__}: {error}".splitlines()[0]}
                continue
            reference = logits if reference is None else reference
            variants[name] = {"available": True, "why": "", "ms": statistics.median(runs), "runs_ms": runs,
                              "peak_bytes": peak, "max_logit_diff": float((logits - reference).abs().max())}
    finally:
        model.set_attn_implementation(original)
    return {"prompt_len": ids.shape[1], "device": str(device), "dtype": str(lm.dtype).removeprefix("torch."),
            "memory_measure": measure, "variants": variants}
