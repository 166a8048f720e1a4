"""Teacher forcing: the reference and the quantized model read the same tokens (the reference's), and at every
position their next-token distributions are compared — the per-token statistics of llama.cpp's
``llama-perplexity --kl-divergence``, live.

Both models keep their own KV cache and take one token per step, so a step costs one incremental pass of each.
Distributions are the models' raw ones (softmax of the logits, no sampler processors).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from playground.engine.forward import keep_last_logits
from playground.engine.quant.metrics import kl_rows
from playground.engine.token_text import TokenTextCache
from playground.events.quant import QuantStep


def kl_divergence(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    """KL(p ‖ q) in nats between the softmaxes of two logit vectors [vocab] (``metrics.kl_rows`` on one row)."""
    return float(kl_rows(p_logits.float()[None], q_logits.float()[None])[0])


class TeacherForcedScorer:
    """Feeds the reference's tokens to both models and compares their next-token distributions."""

    def __init__(self, reference: Any, quantized: Any, tokenizer: Any, prompt_ids: Sequence[int],
                 device: torch.device) -> None:
        self._models = (reference, quantized)
        self._device = device
        self._text = TokenTextCache(tokenizer)
        self._caches = [DynamicCache(config=m.config) for m in self._models]
        self._logits = self._forward(list(prompt_ids))  # each model's next-token logits [vocab]

    @torch.inference_mode()
    def _forward(self, ids: list[int]) -> list[torch.Tensor]:
        x = torch.tensor([ids], device=self._device)
        outs = []
        for model, cache in zip(self._models, self._caches, strict=True):
            out = model(input_ids=x, cache=cache, use_cache=True, **keep_last_logits(model, 1))
            outs.append(out.logits[0, -1])
        return outs

    def score(self, step: int, token_id: int) -> QuantStep:
        """Compare the distributions at the current position, where the reference chose ``token_id``; then read it."""
        ref, quant = self._logits
        ref_p, quant_p = torch.softmax(ref.float(), -1), torch.softmax(quant.float(), -1)
        quant_top = int(quant_p.argmax())
        event = QuantStep(step=step, token_id=token_id, text=self._text(token_id), kl=kl_divergence(ref, quant),
                          reference_prob=float(ref_p[token_id]), quantized_prob=float(quant_p[token_id]),
                          quantized_top_id=quant_top, quantized_top_text=self._text(quant_top),
                          top1_agrees=quant_top == int(ref_p.argmax()))
        self._logits = self._forward([token_id])
        return event
