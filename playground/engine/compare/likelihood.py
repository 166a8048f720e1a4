"""The log-likelihood of an output under a model: the one output figure that needs the model (the others are
``playground.events.figures``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from playground.models.loaded import LoadedModel


def log_likelihood(lm: LoadedModel, prompt_ids: Sequence[int], ids: Sequence[int]) -> float:
    """Sum of log p(token | everything before it) over ``ids`` after ``prompt_ids``, under ``lm``, in nats."""
    if not ids:
        return 0.0
    with torch.inference_mode():
        full = torch.tensor([[*prompt_ids, *ids]], device=lm.device)
        logits = lm.model(full).logits[0, len(prompt_ids) - 1 : -1].float()  # [len(ids), vocab]: predicts ids
        logprobs = torch.log_softmax(logits, dim=-1)
        return float(logprobs.gather(1, torch.tensor(ids, device=lm.device)[:, None]).sum())
