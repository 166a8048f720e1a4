"""Model calls shared by the strategies: the prefill that fills the KV cache, and timing that waits for the device."""

from __future__ import annotations

import inspect
from collections.abc import Generator
from typing import Any

import torch
from transformers import DynamicCache

# Long prompts are read this many tokens at a time, so Stop (and closing the window) is honoured between chunks
# and the prefill can report progress. Prompts up to this length take exactly one forward pass, as generate does.
PREFILL_CHUNK = 256


def deferred_tail(prompt_len: int, chunk: int = PREFILL_CHUNK) -> int:
    """How many of the prompt's last tokens a step can read with its own input while the rest is still read in
    whole chunks: the last chunk's worth (1 to ``chunk`` tokens; the whole of a short prompt)."""
    return prompt_len - (max(prompt_len - 1, 0) // chunk) * chunk


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work, so timings measure the work and not just its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def keep_last_logits(model: Any, n: int) -> dict[str, Any]:
    """Forward-pass arguments that compute logits for the last ``n`` positions only, where the model allows it
    (as ``generate`` does): the others would be a [positions, vocab] matrix nobody reads. Callers still slice
    the last ``n`` rows, for models without the option."""
    return {"logits_to_keep": n} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def prefill_in_chunks(
    model: Any, prompt: torch.Tensor, chunk: int = PREFILL_CHUNK, cache: Any = None
) -> Generator[int, None, tuple[torch.Tensor, Any]]:
    """The prompt [1, prompt_len] through the model, ``chunk`` tokens per forward pass into one cache (a new
    DynamicCache unless ``cache`` is given, e.g. a paged one).

    Yields the number of prompt tokens read after each chunk but the last; returns the last position's logits
    [1, vocab] and the filled cache.
    """
    cache = cache if cache is not None else DynamicCache(config=model.config)
    extra = keep_last_logits(model, 1)
    total = prompt.shape[1]
    logits = None
    for start in range(0, total, chunk):
        out = model(input_ids=prompt[:, start : start + chunk], cache=cache, use_cache=True, **extra)
        logits = out.logits[:, -1, :]
        if start + chunk < total:
            yield start + chunk
    assert logits is not None, "an empty prompt has nothing to prefill"
    return logits, cache


def prefill(model: Any, prompt: torch.Tensor) -> tuple[torch.Tensor, DynamicCache]:
    """The whole prompt at once (no stop checks): last-position logits [1, vocab] and the cache."""
    chunks = prefill_in_chunks(model, prompt, chunk=max(1, prompt.shape[1]))
    while True:
        try:
            next(chunks)
        except StopIteration as end:
            return end.value
