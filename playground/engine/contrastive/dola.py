"""DoLa, decoding by contrasting layers (Chuang et al. 2023): the amateur is the expert's own premature layer, chosen
per token as the candidate layer whose next-token distribution (its logit lens: final norm + LM head on its output)
differs most from the final layer's, by Jensen-Shannon divergence:

    M = argmax_{j in J} JSD(q_N || q_j),     score(x) = log q_N(x) − log q_M(x)  over { x : q_N(x) ≥ α · max q_N }

with a repetition penalty on the scores (the paper: θ = 1.2, the rule of Keskar et al. 2019). Layers are numbered as
``output_hidden_states``: 0 is the embeddings, j the output of layer j; N, the last layer, is the expert itself.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from playground.config import ConfigError
from playground.engine.contrastive.amateurs import Amateur
from playground.engine.layers.lens import LayerStack

PAPER_MAX_LAYERS = 40  # deeper models take 20 layers per bucket (the paper's 65B model: layers 0-18 or 60-78)


def candidate_layers(spec: str, count: int, tied: bool) -> tuple[int, ...]:
    """The candidate premature layers of a ``count``-layer model: the paper's buckets (even layers of the lower or
    upper half) or a list. A model with tied embeddings skips the embeddings and layer 1 (their lens is the input
    token's own row: trivially far from everything)."""
    spec = spec.strip()
    if spec in ("low", "high"):
        start = 0 if not tied else 2 if count > 2 else 1 if count == 2 else 0
        half = count // 2
        if spec == "low":
            stop = half if count <= PAPER_MAX_LAYERS else 20
            found = tuple(range(start, stop, 2))
        else:
            found = tuple(range(half if count <= PAPER_MAX_LAYERS else count - 20, count, 2))
        return found or (min(start, count - 1),)
    try:
        found = tuple(sorted({int(part) for part in spec.split(",")}))
    except ValueError:
        raise ConfigError(f"dola_layers must be low, high or layer numbers such as 2,6,10 (got {spec!r})") from None
    outside = [layer for layer in found if not 0 <= layer < count]
    if not found or outside:
        raise ConfigError(f"dola_layers {spec!r}: each layer must be between 0 (the embeddings) and {count - 1} for "
                          f"this {count}-layer model (the last layer is the expert itself)")
    return found


def jensen_shannon(final: torch.Tensor, layers: torch.Tensor) -> torch.Tensor:
    """``final`` [vocab] and ``layers`` [n, vocab] log-probabilities → [n] JSD(final || layer) in nats:
    ½ KL(P || M) + ½ KL(Q || M), M = ½ (P + Q) (log M by logaddexp: finite where both probabilities underflow)."""
    log_m = torch.logaddexp(final[None], layers) - math.log(2)  # [n, vocab]
    return 0.5 * (final.exp()[None] * (final[None] - log_m)).sum(-1) + 0.5 * (layers.exp() * (layers - log_m)).sum(-1)


def penalise_repeats(scores: torch.Tensor, ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """``scores`` [vocab] with the scores of the tokens in ``ids`` [1, n] divided by ``penalty`` (multiplied when
    negative): CTRL's repetition penalty, as transformers applies it to DoLa's contrast. A new tensor."""
    if penalty == 1.0:
        return scores
    seen = torch.unique(ids[0])
    picked = scores[seen]
    out = scores.clone()
    out[seen] = torch.where(picked < 0, picked * penalty, picked / penalty)
    return out


class DolaAmateur(Amateur):
    kind = "dola"

    def __init__(self, stack: LayerStack, layers: tuple[int, ...]) -> None:
        super().__init__()
        self.stack = stack
        self.candidates = layers
        self.hidden: dict[int, torch.Tensor] = {}  # candidate layer -> [1, hidden] at the newest position
        self.chosen = -1  # the premature layer of the last step
        self.jsd: tuple[float, ...] = ()  # of each candidate, the last step
        shown = ", ".join(map(str, layers))
        self.detail = (f"DoLa: per token, the layer of {{{shown}}} (of {stack.count}) whose lens differs most from "
                       "the last layer (Jensen-Shannon divergence)")

    def expert_pass(self) -> AbstractContextManager:
        return _TapLayers(self)

    def _next_logits(self, ids: torch.Tensor, expert_logits: torch.Tensor | None = None) -> torch.Tensor:
        assert expert_logits is not None, "DoLa compares with the expert's own logits"
        missing = [j for j in self.candidates if j not in self.hidden]
        assert not missing, f"the expert's pass did not reach layers {missing}"
        lens = self.stack.lens_logits(torch.cat([self.hidden[j] for j in self.candidates]))  # [n, vocab]
        divergence = jensen_shannon(expert_logits.float().log_softmax(-1), lens.log_softmax(-1))  # [n]
        row = int(divergence.argmax())
        self.chosen, self.jsd = self.candidates[row], tuple(divergence.tolist())
        return lens[row]


class _TapLayers:
    """Hooks that keep each candidate layer's hidden state at the newest position during one expert pass: layer 0
    (the embeddings, as the model feeds them to its first layer) from the first layer's input, layer j from layer
    j's output."""

    def __init__(self, amateur: DolaAmateur) -> None:
        self.amateur = amateur
        self.handles: list = []

    def __enter__(self) -> _TapLayers:
        keep = self.amateur.hidden
        keep.clear()
        layers = self.amateur.stack.layers
        for j in self.amateur.candidates:
            if j == 0:
                def before(_module: nn.Module, args: tuple, kwargs: dict) -> None:
                    hidden = args[0] if args else kwargs["hidden_states"]
                    keep[0] = hidden[0, -1:]
                self.handles.append(layers[0].register_forward_pre_hook(before, with_kwargs=True))
            else:
                def after(_module: nn.Module, _args: tuple, output: Any, j: int = j) -> None:
                    hidden = output[0] if isinstance(output, tuple) else output
                    keep[j] = hidden[0, -1:]
                self.handles.append(layers[j - 1].register_forward_hook(after))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
