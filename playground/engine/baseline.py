"""Plain greedy decoding of a prompt, timed: the reference that speculative decoding, early exit and layer
skipping are compared with (the same per-token analysis as a greedy run, no events)."""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from playground.config import RunSettings
from playground.engine.forward import prefill, sync_device
from playground.engine.processors import build_pipeline
from playground.engine.run_context import NO_CONTEXT, RunContext
from playground.engine.samplers.grammar import Grammar
from playground.engine.step_analysis import analyse_step
from playground.models.loaded import LoadedModel


def plain_greedy(lm: LoadedModel, settings: RunSettings, prompt_ids: list[int], tokens: int,
                 context: RunContext = NO_CONTEXT) -> tuple[list[int], float]:
    """``tokens`` greedy tokens after ``prompt_ids`` with every layer (the settings' penalties apply), one target
    pass per token with a greedy run's per-token analysis; returns the tokens and the decode speed (tokens/s,
    prefill excluded).

    The run's Stop (``context``) is polled before the prompt's pass and each token: a stopped decode returns fewer than
    ``tokens`` tokens (the speed over those, 0.0 for none), which the caller reports as cut short."""
    pipeline = build_pipeline(settings, sampling=False, tokenizer=lm.tokenizer, vocab_size=lm.model.config.vocab_size,
                              eos_ids=lm.eos_token_ids, carried=("grammar",))
    grammar = next((s for s in pipeline if isinstance(s, Grammar)), None)  # a constraint follows the tokens
    ids = torch.tensor([prompt_ids], device=lm.device)
    chosen: list[int] = []
    if context.stopped():
        return chosen, 0.0
    with torch.inference_mode():
        # The prompt but its last token is prefilled: every timed token then costs one forward pass, as in the
        # runs compared with it (which read the prompt's last token with their first step).
        cache = prefill(lm.model, ids[:, :-1])[1] if ids.shape[1] > 1 else DynamicCache(config=lm.model.config)
        sync_device(lm.device)
        start = time.perf_counter()
        for step in range(tokens):
            if context.stopped():
                break
            logits = lm.model(input_ids=ids[:, -1:], cache=cache, use_cache=True).logits[:, -1, :]
            analysis = analyse_step(pipeline, ids, logits.float(), settings.num_candidates)
            token = int(analysis.processed_logits.argmax(dim=-1).item())
            analysis.token_id = token
            analysis.to_event(step=step, text="", forced=False, step_ms=0.0, kv_bytes=0, token_text=lambda t: "")
            chosen.append(token)
            if grammar is not None:
                grammar.accept(token, 0.0)
            ids = torch.cat([ids, ids.new_tensor([[token]])], dim=1)
        sync_device(lm.device)
    seconds = time.perf_counter() - start
    return chosen, len(chosen) / seconds if chosen and seconds > 0 else 0.0
