"""DoLa, decoding by contrasting layers (Chuang et al. 2023): the amateur is the expert's own premature layer, chosen
per token among candidate layers as the one whose next-token distribution differs most from the final layer's, then

    score(x) = log q_N(x) − log q_M(x)  over { x : q_N(x) ≥ α · max q_N }

with a repetition penalty on the scores (the paper: θ = 1.2, the rule of Keskar et al. 2019). Layers are numbered as
``output_hidden_states``: 0 is the embeddings, j the output of layer j; N, the last layer, is the expert itself.

Two variants (``--dola-variant``):

- ``reference``: the authors' code as transformers 4.46 shipped it (``_dola_decoding``, ``_dola_select_contrast``,
  ``_relative_top_filter``): q_j = softmax(lm_head(h_j)), the LM head on the layer's *un-normalised* hidden state
  (no final norm, no soft-capping), the layer chosen by ½[KL(M‖q_N) + KL(M‖q_j)] (``F.kl_div(log q, M)``, averaged
  over the vocabulary), M = ½(q_N + q_j); the relative-top filter (the expert's log-softmax below max + log α: −∞ in
  the scores, −1e-3 in the baseline), the contrast final − baseline, then the repetition penalty on it.
- ``formula``: the paper's text: q_j = the layer's logit lens (final norm + LM head + the model's soft-capping), the
  layer chosen by the true Jensen-Shannon divergence ½[KL(q_N‖M) + KL(q_j‖M)], the α plausibility cut.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from playground.config import ConfigError
from playground.engine.contrastive.amateurs import Amateur
from playground.engine.contrastive.scores import NEG_INF, Contrast, amateur_logprobs
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
        return found or (start,)  # 4.46: [start_layer] where the low bucket is that layer alone
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


def authors_divergence(final: torch.Tensor, layers: torch.Tensor) -> torch.Tensor:
    """``final`` [vocab] and ``layers`` [n, vocab] logits → [n]: the authors' "JSD", exactly as transformers 4.46's
    ``_dola_select_contrast`` computes it: ½ (KL(M || P) + KL(M || Q)), each ``F.kl_div(log p, M, reduction="none")``
    averaged over the vocabulary (the argmax is DoLa's choice; × vocab gives nats)."""
    softmax_final = F.softmax(final[None], dim=-1)  # [1, vocab] (4.46: [batch, vocab])
    softmax_layers = F.softmax(layers[:, None], dim=-1)  # [n, 1, vocab]
    avg = 0.5 * (softmax_final[None] + softmax_layers)
    kl1 = F.kl_div(F.log_softmax(final[None], dim=-1)[None], avg, reduction="none").mean(-1)
    kl2 = F.kl_div(F.log_softmax(layers[:, None], dim=-1), avg, reduction="none").mean(-1)
    return (0.5 * (kl1 + kl2)).mean(-1)  # [n]: the batch mean of a batch of one


def relative_top_filter(scores: torch.Tensor, baseline_scores: torch.Tensor, relative_top: float = 0.1,
                        filter_value: float = NEG_INF, base_filter_value: float = -1e-3,
                        min_tokens_to_keep: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers 4.46's ``_relative_top_filter`` (from Li et al.'s contrastive-decoding code) on [..., vocab]
    logits: both log-softmaxed; where the expert's log-prob is below max + log(relative_top) (keeping at least
    ``min_tokens_to_keep``), the expert's gets ``filter_value`` and the baseline's ``base_filter_value``. Returns
    (scores, baseline, the threshold [..., 1])."""
    scores_normalized = scores.log_softmax(dim=-1)
    baseline_scores_normalized = baseline_scores.log_softmax(dim=-1)
    sorted_logits = torch.sort(scores_normalized, descending=True).values
    min_thresh = sorted_logits[..., min_tokens_to_keep - 1]
    probs_max = torch.max(scores_normalized, dim=-1).values
    probs_thresh = probs_max + (math.log(relative_top) if relative_top > 0 else NEG_INF)
    probs_thresh = torch.min(min_thresh, probs_thresh).unsqueeze(-1)
    below = scores_normalized < probs_thresh
    baseline_scores_normalized[below] = base_filter_value
    scores_normalized[below] = filter_value
    return scores_normalized, baseline_scores_normalized, probs_thresh


def reference_contrast(expert_logits: torch.Tensor, premature_logits: torch.Tensor, alpha: float,
                       amateur_temperature: float) -> Contrast:
    """The reference variant's contrast of one position: ``expert_logits`` [vocab] (after the penalties),
    ``premature_logits`` [vocab_a] the premature layer's bare-head logits (over ``amateur_temperature``) →
    the relative-top filter at ``alpha`` (4.46: 0.1, the default) and scores = final − baseline (−∞ outside). The
    amateur's log-probs recorded are the premature layer's own (its filter value changes no score)."""
    expert = expert_logits.float()
    width = expert.shape[-1]
    premature = premature_logits[:width].float() / amateur_temperature
    final, baseline, threshold = relative_top_filter(expert, premature, alpha)
    plausible = final > NEG_INF
    return Contrast(expert.log_softmax(dim=-1), amateur_logprobs(premature_logits, amateur_temperature, width),
                    plausible, final - baseline, float(threshold[0]))


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

    def __init__(self, stack: LayerStack, layers: tuple[int, ...], variant: str = "reference") -> None:
        super().__init__()
        if variant not in ("reference", "formula"):
            raise ConfigError(f"dola_variant must be reference or formula (got {variant!r})")
        self.stack = stack
        self.candidates = layers
        self.variant = variant
        self.hidden: dict[int, torch.Tensor] = {}  # candidate layer -> [1, hidden] at the newest position
        self.chosen = -1  # the premature layer of the last step
        self.jsd: tuple[float, ...] = ()  # of each candidate, the last step (nats)
        shown = ", ".join(map(str, layers))
        if variant == "reference":
            self.detail = (f"DoLa, reference variant (the authors' code, as transformers 4.46 ran it): per token, "
                           f"the layer of {{{shown}}} (of {stack.count}) whose LM head on its un-normalised output "
                           "differs most from the last layer by ½[KL(M‖P) + KL(M‖Q)], then the relative-top filter")
        else:
            self.detail = (f"DoLa, formula variant (the paper's text): per token, the layer of {{{shown}}} (of "
                           f"{stack.count}) whose logit lens (final norm + LM head) differs most from the last layer "
                           "(Jensen-Shannon divergence ½[KL(P‖M) + KL(Q‖M)])")

    def expert_pass(self) -> AbstractContextManager:
        return _TapLayers(self)

    def contrast(self, expert_logits: torch.Tensor, amateur_logits: torch.Tensor, alpha: float,
                 amateur_temperature: float) -> Contrast:
        if self.variant == "reference":
            return reference_contrast(expert_logits, amateur_logits, alpha, amateur_temperature)
        return super().contrast(expert_logits, amateur_logits, alpha, amateur_temperature)

    def _next_logits(self, ids: torch.Tensor, expert_logits: torch.Tensor | None = None) -> torch.Tensor:
        assert expert_logits is not None, "DoLa compares with the expert's own logits"
        missing = [j for j in self.candidates if j not in self.hidden]
        assert not missing, f"the expert's pass did not reach layers {missing}"
        hidden = torch.cat([self.hidden[j] for j in self.candidates])  # [n, hidden]
        final = expert_logits.float()
        if self.variant == "reference":
            premature = self.stack.bare_head_logits(hidden)  # [n, vocab]: no final norm, no soft-capping
            choice = authors_divergence(final, premature)
            divergence = choice * final.shape[-1]  # nats, for the record
        else:
            premature = self.stack.lens_logits(hidden)  # [n, vocab]
            choice = divergence = jensen_shannon(final.log_softmax(-1), premature.log_softmax(-1))  # [n]
        row = int(choice.argmax())
        self.chosen, self.jsd = self.candidates[row], tuple(divergence.tolist())
        return premature[row]


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
