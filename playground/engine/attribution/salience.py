"""Prompt salience for one step: occlusion, gradient × input and integrated gradients of log p(chosen token).

The context is the prompt and the output before the step; the explained quantity is the log-probability, under
the model as it is (raw output distribution, no sampler), of the token the step chose, read at the last position.
Each method gives one score per context token, in nats:

- occlusion: log p(context) − log p(context with that token replaced by the baseline token) (Captum's
  ``FeatureAblation`` with each token its own feature; all positions in batches of ``batch``);
- gradient × input: ∂ log p / ∂ e_i · e_i for the token's input embedding e_i (Captum's
  ``LayerGradientXActivation`` on the embeddings);
- integrated gradients: (e_i − b_i) · Σ_k w_k ∂ log p / ∂ e_i at b + α_k (e − b), the baseline b every token's
  embedding replaced by the baseline token's (Captum's ``LayerIntegratedGradients`` on the embeddings, same
  rule: "gausslegendre" or "riemann_trapezoid" α_k and w_k, ``steps`` points).

Embeddings come from the model-anatomy seam; the model's own forward runs on ``inputs_embeds`` (position
embeddings, embedding scales and soft-capping are its own). Stop is polled between batches.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from playground.config.catalog import Progress, StopCheck
from playground.config.errors import ConfigError
from playground.engine.token_text import IncrementalDecoder
from playground.events.salience import METHOD_TITLES, SALIENCE_METHODS, SalienceAgreement, SalienceMap
from playground.models.anatomy import anatomy_of
from playground.models.loaded import LoadedModel

IG_RULES = ("gausslegendre", "riemann_trapezoid")
OCCLUDE_UNITS = ("token", "word")
DEFAULT_IG_STEPS = 32
OCCLUSION_BATCH = 16
IG_BATCH = 8


class SalienceStopped(Exception):
    """Stop came between two batches."""


def ig_points(steps: int, rule: str) -> tuple[list[float], list[float]]:
    """The α_k in [0, 1] and weights w_k of ``rule`` (Captum's ``approximation_parameters``)."""
    if steps < 2:
        raise ConfigError(f"integrated gradients need at least 2 steps, not {steps}")
    if rule == "gausslegendre":
        x, w = np.polynomial.legendre.leggauss(steps)
        return [float(a) for a in 0.5 * (1 + x)], [float(v) for v in 0.5 * w]
    if rule == "riemann_trapezoid":  # Captum's weights as it defines them: 1/n each, the two ends halved
        weights = [1.0 / steps] * steps
        weights[0] /= 2
        weights[-1] /= 2
        return [float(a) for a in np.linspace(0, 1, steps)], weights
    raise ConfigError(f"integrated gradients' rule must be one of {', '.join(IG_RULES)}, not {rule!r}")


def baseline_token(lm: LoadedModel) -> int:
    """The token that stands in for an occluded one: the tokenizer's pad token, else its unknown or end token."""
    tok = lm.tokenizer
    for attr in ("pad_token_id", "unk_token_id", "eos_token_id"):
        value = getattr(tok, attr, None)
        if isinstance(value, int):
            return value
    return 0


class TargetLogprob:
    """log p(target | context) at the last position, as a function of the input embeddings [batch, T, d]."""

    def __init__(self, lm: LoadedModel, ids: Sequence[int], target: int) -> None:
        self.model = lm.model
        self.anatomy = anatomy_of(lm.model)
        self.target = target
        self.ids = torch.tensor([list(ids)], device=lm.device)  # [1, T]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.anatomy.embed(ids)  # [B, T, d]

    def __call__(self, embeds: torch.Tensor) -> torch.Tensor:  # -> [B]
        mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        out = self.model(inputs_embeds=embeds, attention_mask=mask, use_cache=False, logits_to_keep=1)
        return torch.log_softmax(out.logits[:, -1].float(), dim=-1)[:, self.target]


def word_groups(texts: Sequence[str]) -> list[int]:
    """Each token's word number: a word starts at a token whose text starts with whitespace or is punctuation
    (or follows punctuation), so "Paris" split into " Par" + "is" is one word."""
    groups: list[int] = []
    word = -1
    after_mark = True
    for text in texts:
        mark = bool(text) and not text[0].isalnum() and not text[0].isspace()
        if after_mark or not text or text[0].isspace() or mark:
            word += 1
        groups.append(word)
        after_mark = mark
    return groups


def occlusion(f: TargetLogprob, baseline: int, should_stop: StopCheck | None = None,
              batch: int = OCCLUSION_BATCH, groups: Sequence[int] | None = None) -> np.ndarray:
    """Per position: f(context) − f(context with that token, or every token of its group (a word), replaced by
    ``baseline``); a group's tokens share its score (Captum's ``FeatureAblation`` with that feature mask)."""
    ids = f.ids[0]
    n = ids.shape[0]
    group = torch.tensor(list(groups) if groups is not None else list(range(n)), device=ids.device)  # [T]
    count = int(group.max()) + 1
    with torch.no_grad():
        full = float(f(f.embed(f.ids))[0])
        by_group = np.zeros(count)
        for start in range(0, count, batch):
            if should_stop is not None and should_stop():
                raise SalienceStopped
            rows = torch.arange(start, min(count, start + batch), device=ids.device)  # [b] groups
            hidden = group[None, :] == rows[:, None]  # [b, T]
            occluded = torch.where(hidden, torch.full_like(ids, baseline)[None], ids[None])
            by_group[start:start + len(rows)] = full - f(f.embed(occluded)).double().cpu().numpy()
    return by_group[group.cpu().numpy()]


def _gradient(f: TargetLogprob, embeds: torch.Tensor) -> torch.Tensor:
    embeds = embeds.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(embeds).sum(), embeds)
    return grad


def grad_x_input(f: TargetLogprob) -> np.ndarray:
    with torch.inference_mode(False), torch.enable_grad():
        e = f.embed(f.ids).detach()
        return (_gradient(f, e) * e).sum(-1)[0].double().cpu().numpy()


def integrated_gradients(f: TargetLogprob, baseline: int, steps: int = DEFAULT_IG_STEPS,
                         rule: str = "gausslegendre", should_stop: StopCheck | None = None,
                         progress: Callable[[float], None] | None = None, batch: int = IG_BATCH
                         ) -> tuple[np.ndarray, dict[str, float]]:
    """Scores per position and the completeness figures: their sum and f(e) − f(b)."""
    alphas, weights = ig_points(steps, rule)
    with torch.inference_mode(False), torch.enable_grad():
        e = f.embed(f.ids).detach()  # [1, T, d]
        b = f.embed(torch.full_like(f.ids, baseline)).detach()
        total = torch.zeros_like(e, dtype=torch.float32)
        for start in range(0, steps, batch):
            if should_stop is not None and should_stop():
                raise SalienceStopped
            a = torch.tensor(alphas[start:start + batch], dtype=e.dtype, device=e.device)[:, None, None]
            w = torch.tensor(weights[start:start + batch], dtype=torch.float32, device=e.device)[:, None, None]
            grads = _gradient(f, b + a * (e - b))  # [k, T, d]
            total += (grads.float() * w).sum(0, keepdim=True)
            if progress is not None:
                progress(min(1.0, (start + batch) / steps))
        scores = ((e - b).float() * total).sum(-1)[0].double().cpu().numpy()
        with torch.no_grad():
            expected = float(f(e)[0] - f(b)[0])
    total_sum = float(scores.sum())
    return scores, {"sum": total_sum, "expected_sum": expected, "completeness_gap": total_sum - expected}


def ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their mean rank."""
    order = np.argsort(values, kind="mergesort")
    ranked = np.empty(len(values))
    sorted_values = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranked[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranked


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson's of the ranks); nan when either is constant."""
    ra, rb = ranks(np.asarray(a, dtype=float)), ranks(np.asarray(b, dtype=float))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denominator) if denominator > 0 else float("nan")


def context_texts(lm: LoadedModel, ids: Sequence[int]) -> tuple[str, ...]:
    decoder = IncrementalDecoder(lm.tokenizer)
    return tuple(decoder.push(i) for i in ids)


def salience_events(lm: LoadedModel, prompt_ids: Sequence[int], output_ids: Sequence[int], step: int,
                    methods: Sequence[str] = SALIENCE_METHODS, ig_steps: int = DEFAULT_IG_STEPS,
                    ig_rule: str = "gausslegendre", should_stop: StopCheck | None = None,
                    progress: Progress | None = None, occlude: str = "token"
                    ) -> Iterator[SalienceMap | SalienceAgreement]:
    """The maps of step ``step`` (its token is ``output_ids[step]``), one per method, then their agreement.
    Stop between batches ends the stream after the maps already made (no agreement)."""
    unknown = [m for m in methods if m not in SALIENCE_METHODS]
    if unknown or not methods:
        raise ConfigError(f"salience methods must be among {', '.join(SALIENCE_METHODS)}, not {unknown or 'none'}")
    if occlude not in OCCLUDE_UNITS:
        raise ConfigError(f"occlusion hides a token or a word ({', '.join(OCCLUDE_UNITS)}), not {occlude!r}")
    if not 0 <= step < len(output_ids):
        raise ConfigError(f"step {step} is not in the run (it has steps 0 to {len(output_ids) - 1})")
    ig_points(ig_steps, ig_rule)
    context = [*prompt_ids, *output_ids[:step]]
    target = int(output_ids[step])
    f = TargetLogprob(lm, context, target)
    base = baseline_token(lm)
    base_text = lm.tokenizer.convert_ids_to_tokens(base)
    texts = context_texts(lm, [*context, target])
    with torch.no_grad():
        logprob = float(f(f.embed(f.ids))[0])
    say = progress or (lambda _m, _f: None)
    maps: list[SalienceMap] = []
    for k, method in enumerate(methods):
        title = METHOD_TITLES[method]
        say(f"Salience of step {step}: {title}…", k / len(methods))
        start = time.perf_counter()
        figures: dict[str, float] = {}
        try:
            if method == "occlusion":
                words = occlude == "word"
                scores = occlusion(f, base, should_stop, groups=word_groups(texts[:-1]) if words else None)
                detail = (f"each {'word (all its tokens)' if words else 'token'} replaced by {base_text!r} in turn; "
                          "Δ log p")
            elif method == "grad_x_input":
                scores = grad_x_input(f)
                detail = "∂ log p / ∂ embedding · embedding, summed over the embedding"
            else:
                def along(done: float, k: int = k, title: str = title) -> None:
                    say(f"Salience of step {step}: {title}…", (k + done) / len(methods))
                scores, figures = integrated_gradients(f, base, ig_steps, ig_rule, should_stop, along)
                detail = (f"{ig_steps} points ({ig_rule}) from every token {base_text!r} to the context; "
                          f"sum {figures['sum']:.3f} vs log p − log p(baseline) {figures['expected_sum']:.3f}")
        except SalienceStopped:
            return
        made = SalienceMap(step=step, method=method, target_id=target, target_text=texts[-1],
                           target_logprob=logprob, token_ids=tuple(context), tokens=texts[:-1],
                           prompt_tokens=len(prompt_ids), scores=tuple(float(s) for s in scores),
                           baseline=f"token {base} {base_text!r}", detail=detail,
                           seconds=time.perf_counter() - start, figures=figures)
        maps.append(made)
        yield made
    pairs = tuple((a.method, b.method) for i, a in enumerate(maps) for b in maps[i + 1:])
    by = {m.method: m.scores for m in maps}
    yield SalienceAgreement(step=step, pairs=pairs, rho=tuple(spearman(by[a], by[b]) for a, b in pairs),
                            top_tokens=tuple(int(np.argmax(m.scores)) for m in maps))
    say(f"Salience of step {step} done", 1.0)
