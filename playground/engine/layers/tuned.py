"""The tuned lens (Belrose et al. 2023): one affine translator per layer, h ↦ h + W_l h + b_l (the identity at the
start), trained so that the final norm and LM head on the translated hidden state match the model's own final
distribution: the loss is KL(p_final || p_lens(translated h_l)) over the shipped calibration text. The last layer
needs none (its lens is the model's output). Translators are cached per model as safetensors in the user cache.

``train_tuned_lens`` is a generator: it yields ``TrainProgress`` between steps (a job shows it and can stop it) and
returns the ``TunedLens``.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from playground.engine.quant.calibration import load_text, text_ids
from playground.engine.run_context import NO_CONTEXT, RunContext
from playground.models.anatomy import anatomy_of
from playground.models.paths import cache_root

WINDOW = 256  # tokens per forward pass when collecting hidden states


@dataclass
class TunedLens:
    """Translators for the layers below the last: ``weights`` [layers − 1, d, d], ``biases`` [layers − 1, d];
    layer i (0-based, the output of layer i + 1) translates as h + h Wᵢᵀ + bᵢ."""

    weights: torch.Tensor
    biases: torch.Tensor
    info: dict[str, str] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return self.weights.shape[0] + 1

    @classmethod
    def identity(cls, layers: int, hidden: int) -> TunedLens:
        return cls(torch.zeros(layers - 1, hidden, hidden), torch.zeros(layers - 1, hidden))

    def translate(self, hidden: torch.Tensor, layers: Sequence[int]) -> torch.Tensor:
        """[n, d] hidden states of the 0-based ``layers`` (one per row) → translated [n, d]; the last layer's rows
        stay as they are."""
        rows = []
        for row, layer in zip(hidden, layers, strict=True):
            if layer >= self.count - 1:
                rows.append(row)
            else:
                w, b = self.weights[layer].to(row.dtype), self.biases[layer].to(row.dtype)
                rows.append(row + row @ w.T + b)
        return torch.stack(rows)


@dataclass(frozen=True)
class TrainProgress:
    step: int
    steps: int
    loss: float  # mean KL (nats) over the layers, this step's batch
    elapsed_s: float


def lens_path(model_name: str, layers: int, hidden: int) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_name).strip("_") or "model"
    return cache_root() / "tuned-lens" / f"{safe}-{layers}x{hidden}.safetensors"


def save_tuned_lens(lens: TunedLens, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    save_file({"weights": lens.weights.contiguous(), "biases": lens.biases.contiguous()}, str(tmp),
              metadata=dict(lens.info))
    tmp.replace(path)
    return path


def load_tuned_lens(path: Path) -> TunedLens | None:
    if not path.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        info = dict(f.metadata() or {})
    tensors = load_file(str(path))
    return TunedLens(tensors["weights"], tensors["biases"], info)


def collect_hidden(stack, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's output over ``ids`` in windows of ``WINDOW`` tokens: ([layers − 1, N, d] the layers below the
    last, [N, vocab] the model's final log-probabilities), float32. ``stack``: the model's ``LayerStack``."""
    below, final = [], []
    with torch.inference_mode():
        for start in range(0, len(ids), WINDOW):
            window = torch.tensor([ids[start : start + WINDOW]], device=stack.model.device)
            if window.shape[1] < 2:
                continue
            out = stack.model(input_ids=window, output_hidden_states=True, use_cache=False)
            # hidden_states[j] is layer j's output (0: the embeddings; the last is already normed)
            below.append(torch.stack([h[0] for h in out.hidden_states[1:-1]]).float())
            final.append(out.logits[0].float().log_softmax(-1))
    return torch.cat(below, dim=1).clone(), torch.cat(final).clone()  # clones outside inference mode: trainable


def lens_kl(stack, lens: TunedLens | None, hidden: torch.Tensor, final: torch.Tensor, chunk: int = 128
            ) -> list[float]:
    """Mean KL(p_final || p_lens) in nats of each layer below the last over the positions of ``hidden``
    [layers − 1, N, d] (``final`` [N, vocab] log-probabilities), through ``lens`` (None: the logit lens)."""
    means = []
    with torch.inference_mode():
        for layer in range(hidden.shape[0]):
            total = 0.0
            for start in range(0, hidden.shape[1], chunk):
                h = hidden[layer, start : start + chunk]
                if lens is not None:
                    h = lens.translate(h, [layer] * h.shape[0])
                lp = stack.lens_logits(h.to(stack.head_dtype)).log_softmax(-1)
                target = final[start : start + chunk]
                total += float((target.exp() * (target - lp)).sum())
            means.append(total / hidden.shape[1])
    return means


def train_tuned_lens(stack, hidden: torch.Tensor, final: torch.Tensor, *, steps: int = 40, batch: int = 64,
                     lr: float = 3e-3, seed: int = 0, context: RunContext = NO_CONTEXT,
                     check_every: int = 10, validation_share: float = 0.2
                     ) -> Generator[TrainProgress, None, TunedLens]:
    """Adam on every translator at once, its rate decaying linearly to 0; each layer's KL goes backward on its own,
    so memory holds one layer's logits; the model's weights stay frozen.

    The last ``validation_share`` of the positions are held apart: every ``check_every`` steps each layer's KL on
    them is measured and each layer keeps its best translator so far, the identity (step 0) included — Adam moves
    every layer at the same pace, and the top layers, whose logit lens is already close, overshoot first (hence
    also a rate per layer in proportion to its starting KL). Returns
    the ``TunedLens`` (the best of the steps done so far if the context's Stop, polled before each step, came)."""
    layers, n, d = hidden.shape
    held = max(1, int(n * validation_share)) if validation_share > 0 and n > 1 else 0
    n -= held
    check_h, check_f = hidden[:, n:], final[n:]
    lens = TunedLens.identity(layers + 1, d)
    best = lens_kl(stack, None, check_h, check_f) if held else None
    best_w, best_b = lens.weights.clone(), lens.biases.clone()
    weights = [w.clone().requires_grad_(True) for w in lens.weights]  # one tensor per layer: a rate per layer
    biases = [b.clone().requires_grad_(True) for b in lens.biases]
    # Adam's steps have the same size whatever a layer's loss: a layer whose logit lens is already close (the top
    # ones) gets a rate in proportion to its KL, or it overshoots.
    start_kl = best if best is not None else [1.0] * layers
    top = max(start_kl) or 1.0
    optimiser = torch.optim.Adam([{"params": [w, b], "lr": lr * max(k / top, 0.02)}
                                  for w, b, k in zip(weights, biases, start_kl, strict=True)])
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: 1.0 - step / steps)
    generator = torch.Generator().manual_seed(seed)
    frozen = [p for p in stack.model.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    start = time.perf_counter()
    try:
        for step in range(steps):
            if context.stopped():
                break
            pick = torch.randint(0, n, (batch,), generator=generator)
            target = final[pick]  # [batch, vocab]
            optimiser.zero_grad()
            loss_total = 0.0
            with torch.enable_grad():  # the app decodes with gradients off
                for layer in range(layers):
                    h = hidden[layer, pick]
                    translated = h + h @ weights[layer].T + biases[layer]
                    lp = stack.lens_logits(translated).log_softmax(-1)
                    loss = (target.exp() * (target - lp)).sum(-1).mean()
                    loss.backward()
                    loss_total += float(loss.detach())
                optimiser.step()
            schedule.step()
            if best is not None and ((step + 1) % check_every == 0 or step + 1 == steps):
                now = TunedLens(torch.stack(weights).detach(), torch.stack(biases).detach())
                for layer, value in enumerate(lens_kl(stack, now, check_h, check_f)):
                    if value < best[layer]:
                        best[layer] = value
                        best_w[layer], best_b[layer] = now.weights[layer], now.biases[layer]
            yield TrainProgress(step + 1, steps, loss_total / layers, time.perf_counter() - start)
    finally:
        for p in frozen:
            p.requires_grad_(True)
    if best is None:
        return TunedLens(torch.stack(weights).detach().clone(), torch.stack(biases).detach().clone())
    return TunedLens(best_w, best_b)


def calibration_ids(tokenizer, name: str, max_tokens: int) -> list[int]:
    return text_ids(tokenizer, load_text(name), max_tokens)


def model_key(model) -> str:
    """A name for the model's cache file: its folder's name and a fingerprint of its LM head (two models with the
    same folder name and shape do not share translators)."""
    config = model.config
    name = Path(str(getattr(config, "name_or_path", "") or config.model_type)).name
    anatomy = anatomy_of(model)
    head = anatomy.head_weight  # a quantized head (no float weight): its codes
    if head is None:
        head = next(iter(anatomy.lm_head.buffers()))
    fingerprint = f"{float(head.detach()[:8].double().sum()):.6e}"
    return f"{name}-{hashlib.sha1(fingerprint.encode()).hexdigest()[:8]}"


_LOADED: dict[Path, tuple[float, TunedLens]] = {}  # path -> (its mtime, the translators): reload instantly


def cached_tuned_lens(model, layers: int) -> TunedLens | None:
    """The model's trained translators from the user cache, or None."""
    path = lens_path_of(model, layers)
    if not path.is_file():
        return None
    mtime = path.stat().st_mtime
    held = _LOADED.get(path)
    if held is None or held[0] != mtime:
        lens = load_tuned_lens(path)
        if lens is None or lens.count != layers:
            return None
        held = _LOADED[path] = (mtime, lens)
    return held[1]


def lens_path_of(model, layers: int) -> Path:
    return lens_path(model_key(model), layers, model.config.get_text_config().hidden_size)
