"""The logit lens: every layer's next-token distribution, from the final norm and LM head applied to that layer's
output (nostalgebraist 2020), all layers of a step in one batched matrix product.

``LayerStack`` is the seam to the model's internals (decoder layers, final norm, LM head); ``lens_step`` turns the
hidden states of the layers that ran into a ``LayerStep`` event.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from playground.config import ConfigError, LayerSettings, LensSettings
from playground.engine.layers.tuned import TunedLens, cached_tuned_lens
from playground.events.layers import LayersStarted, LayerStep, LensCandidate
from playground.models.anatomy import Anatomy, anatomy_of

LN2 = math.log(2)


@dataclass
class LayerStack:
    """The parts of a decoder-only model the lens and the layer loop need (from ``models.anatomy``): the decoder
    layers, the final norm, the LM head and what the model does to its logits after the head (soft-capping)."""

    model: nn.Module
    layers: nn.ModuleList
    norm: nn.Module
    lm_head: nn.Module
    precision: str = "model"  # "bfloat16": lens products through a bfloat16 copy of a float32 LM head
    anatomy: Anatomy | None = None
    kind: str = "logit"  # "tuned": rows of known layers are translated first (``lens_logits(..., layers=...)``)
    tuned: TunedLens | None = None  # the model's trained translators, when it has them

    @classmethod
    def of(cls, model: nn.Module, precision: str = "model", kind: str = "logit") -> LayerStack:
        """``kind`` "tuned" loads the model's cached translators (``ConfigError`` when none were trained); "logit"
        loads them too when they exist, so each layer's KL can be recorded under both lenses."""
        anatomy = anatomy_of(model)
        stack = cls(model, anatomy.layers, anatomy.final_norm, anatomy.lm_head, precision, anatomy, kind)
        stack.tuned = cached_tuned_lens(model, stack.count)
        if kind == "tuned" and stack.tuned is None:
            raise ConfigError("no tuned lens trained for this model yet: train it once (`playground tune-lens`), "
                              "or use --lens-kind logit")
        return stack

    def transform(self, logits: torch.Tensor) -> torch.Tensor:
        return self.anatomy.logit_transform(logits) if self.anatomy is not None else logits

    @property
    def count(self) -> int:
        return len(self.layers)

    @property
    def head_weight(self) -> torch.Tensor | None:
        """The LM head's float weight; None for a head that holds none (a quantized copy's ``QuantLinear``), which
        the lens applies as a module: its own product, never a ``weight`` it does not have."""
        if self.anatomy is not None:
            return self.anatomy.head_weight
        weight = getattr(self.lm_head, "weight", None)
        return weight if isinstance(weight, torch.Tensor) and weight.is_floating_point() else None

    @property
    def head_dtype(self) -> torch.dtype:
        """The dtype the LM head takes its input in: its weight's, else its float buffers' (a quantized head's
        scales), else float32."""
        weight = self.head_weight
        if weight is not None:
            return weight.dtype
        floats = [t.dtype for t in (*self.lm_head.parameters(), *self.lm_head.buffers()) if t.is_floating_point()]
        return floats[0] if floats else torch.float32

    def lens_logits(self, hidden: torch.Tensor, layers: Sequence[int] | None = None,
                    kind: str | None = None) -> torch.Tensor:
        """[n, hidden] layer outputs (before the final norm) → [n, vocab] float32 logits, one matrix product.
        With the tuned lens (``kind``, default the stack's) and ``layers`` (0-based, one per row) the rows are
        translated first."""
        if (kind or self.kind) == "tuned" and layers is not None and self.tuned is not None:
            hidden = self.tuned.translate(hidden, layers)
        normed = self.norm(hidden)
        weight = self.head_weight
        if self.precision == "bfloat16" and weight is not None and weight.dtype == torch.float32:
            # The full-vocabulary product is the lens's whole cost: bfloat16 makes it ~5x cheaper on CPU (SmolLM2:
            # 3.5 ms instead of 18.6 for 30 layers) at ~0.01 bits of entropy.
            bias = cast("torch.Tensor | None", self.lm_head.bias)
            return self.transform(nn.functional.linear(normed.to(torch.bfloat16), bfloat16_copy(weight),
                                                       bias.to(torch.bfloat16) if bias is not None else None).float())
        return self.transform(self.lm_head(normed).float())


    def bare_head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] → [n, vocab] float32: the LM head alone on the rows, no final norm and no logit transform
        (DoLa's premature logits as its authors' code computes them: ``lm_head(hidden_states[j])``)."""
        return self.lm_head(hidden).float()


_BF16_COPIES: dict[int, tuple[int, torch.Tensor]] = {}  # id(weight) -> (its version, the copy): one per LM head


def bfloat16_copy(weight: torch.Tensor) -> torch.Tensor:
    """A bfloat16 copy of ``weight``, made once and again only if the weight changed in place."""
    held = _BF16_COPIES.get(id(weight))
    if held is None or held[0] != weight._version:
        _BF16_COPIES.clear()  # one model at a time
        held = (weight._version, weight.detach().to(torch.bfloat16))
        _BF16_COPIES[id(weight)] = held
    return held[1]


class LayerOutputs:
    """Forward hooks that keep each decoder layer's input and output of the whole pass while active ([batch,
    positions, hidden], no copy; the model's own forward runs unchanged), its tokens picked afterwards
    (``step_event_at``)."""

    def __init__(self, stack: LayerStack) -> None:
        self.stack = stack
        self.inputs: list[torch.Tensor | None] = [None] * stack.count  # [batch, positions, hidden] each
        self.outputs: list[torch.Tensor | None] = [None] * stack.count
        self._handles: list = []

    def __enter__(self) -> LayerOutputs:
        for i, layer in enumerate(self.stack.layers):
            self._handles.append(layer.register_forward_hook(self._hook(i)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, index: int) -> Callable:
        def keep(_module: nn.Module, args: tuple, output: Any) -> None:
            hidden_in = args[0] if args else None
            hidden_out = output[0] if isinstance(output, tuple) else output
            self.inputs[index] = hidden_in if isinstance(hidden_in, torch.Tensor) else None
            self.outputs[index] = hidden_out

        return keep

    def step_event_at(self, batch: int, position: int, step: int, top: int, token_text: Callable[[int], str],
                      final: torch.Tensor, forward_ms: float = 0.0) -> LayerStep:
        """The ``LayerStep`` of the token predicted at ``position`` of batch row ``batch``; ``final`` [vocab]: the
        model's own logits there (the last layer's lens, exactly)."""
        outputs = [h[batch, position] if h is not None else None for h in self.outputs]
        updates = [relative_update(h_in[batch, position], h_out[batch, position])
                   if h_in is not None and h_out is not None else None
                   for h_in, h_out in zip(self.inputs, self.outputs, strict=True)]
        known = {self.stack.count - 1: final.float().log_softmax(dim=-1)}
        return lens_step(self.stack, step, outputs, updates, top, token_text, forward_ms=forward_ms, known=known)


def relative_update(hidden_in: torch.Tensor, hidden_out: torch.Tensor) -> float:
    """‖h_out − h_in‖ / ‖h_in‖: how much a layer changed the residual stream at this position."""
    base = float(hidden_in.float().norm())
    return float((hidden_out.float() - hidden_in.float()).norm()) / base if base > 0 else 0.0


def lens_logprobs(stack: LayerStack, hidden: torch.Tensor, layers: Sequence[int] | None = None,
                  kind: str | None = None) -> torch.Tensor:
    """[n, hidden] layer outputs (of the 0-based ``layers``) → [n, vocab] log-probabilities of their lens
    distributions (the stack's lens, or ``kind``)."""
    return stack.lens_logits(hidden, layers, kind).log_softmax(dim=-1)


def kl_to_final(final: torch.Tensor, logprobs: torch.Tensor) -> list[float]:
    """KL(p_final || p_layer) in nats: ``final`` [vocab], ``logprobs`` [n, vocab] log-probabilities → n values."""
    return (final.exp()[None] * (final[None] - logprobs)).sum(dim=-1).tolist()


def entropy_bits(logprobs: torch.Tensor) -> torch.Tensor:
    """[n, vocab] log-probabilities → [n] entropies in bits."""
    return -(logprobs.exp() * logprobs).sum(dim=-1) / LN2  # lens logits are finite: no 0 × −inf to guard


def lens_step(stack: LayerStack, step: int, outputs: Sequence[torch.Tensor | None],
              updates: Sequence[float | None], top: int, token_text: Callable[[int], str], *,
              exit_layer: int | None = None, skipped: tuple[int, ...] = (), forward_ms: float = 0.0,
              known: dict[int, torch.Tensor] | None = None, full: bool = True) -> LayerStep:
    """The ``LayerStep`` of one token from each layer's output at its position (None: the layer did not run).

    ``known``: lens log-prob rows [vocab] the caller already has, by 0-based layer (early exit computes them on
    the way). ``full``: the lens of every layer that ran (the missing rows in one batched product); otherwise only
    the known rows and the answering layer's — recording then costs next to nothing. The answering layer is the
    exit layer, or the last layer that ran."""
    start = time.perf_counter()
    ran = [i for i, h in enumerate(outputs) if h is not None]
    answering = exit_layer - 1 if exit_layer is not None else ran[-1]
    known = dict(known or {})
    wanted = ran if full else sorted({*known, answering})
    missing = [i for i in wanted if i not in known]
    have = [i for i in wanted if i in known]
    parts = [torch.stack([known[i] for i in have])] if have else []  # [have, vocab]
    if missing:  # one batched product, appended without copying it again
        rows = torch.stack([cast(torch.Tensor, outputs[i]) for i in missing])  # the layers that ran
        parts.insert(0, lens_logprobs(stack, rows, missing))  # [missing, vocab]
    wanted = missing + have  # the rows' order
    logprobs = torch.cat(parts) if len(parts) > 1 else parts[0]  # [wanted, vocab]
    entropy = entropy_bits(logprobs).tolist()
    top_lp, top_index = logprobs.topk(top, dim=-1)  # [wanted, top]
    top_p, top_ids = top_lp.exp().tolist(), top_index.tolist()
    final_top = top_ids[wanted.index(answering)][0]

    n = stack.count
    layer_entropy: list[float | None] = [None] * n
    layer_top_prob: list[float | None] = [None] * n
    layer_top: list[tuple[LensCandidate, ...]] = [()] * n
    agrees: list[bool | None] = [None] * n
    for row, i in enumerate(wanted):
        layer_entropy[i] = entropy[row]
        layer_top_prob[i] = top_p[row][0]
        layer_top[i] = tuple(LensCandidate(t, token_text(t), p) for t, p in zip(top_ids[row], top_p[row],
                                                                                   strict=True))
        agrees[i] = top_ids[row][0] == final_top
    kl_logit, kl_tuned = layer_kls(stack, outputs, wanted, logprobs)
    lens_ms = (time.perf_counter() - start) * 1000
    return LayerStep(
        step=step, layer_entropy=tuple(layer_entropy), layer_top_prob=tuple(layer_top_prob),
        layer_top=tuple(layer_top), agrees_with_final=tuple(agrees), residual_update=tuple(updates),
        exit_layer=exit_layer, skipped=skipped, layers_computed=len(ran), layers_total=n, lens_ms=lens_ms,
        forward_ms=forward_ms, kl_logit=kl_logit, kl_tuned=kl_tuned, lens_kind=stack.kind)


def layer_kls(stack: LayerStack, outputs: Sequence[torch.Tensor | None], wanted: list[int], logprobs: torch.Tensor
              ) -> tuple[tuple[float | None, ...], tuple[float | None, ...]]:
    """Each layer's KL to the last layer's distribution under the logit lens and the tuned lens (the second empty
    without trained translators; both empty when the last layer did not run): the stack's own lens from its rows
    ``logprobs`` (of the 0-based layers ``wanted``), the other one in one more batched product."""
    n = stack.count
    if n - 1 not in wanted:
        return (), ()
    final = logprobs[wanted.index(n - 1)]
    mine: list[float | None] = [None] * n
    for i, value in zip(wanted, kl_to_final(final, logprobs), strict=True):
        mine[i] = value
    if stack.tuned is None:  # the logit lens alone (LayerStack.of refuses a tuned stack without translators)
        return tuple(mine), ()
    other_kind = "logit" if stack.kind == "tuned" else "tuned"
    rows = [i for i in wanted if outputs[i] is not None and i != n - 1]
    other: list[float | None] = [None] * n
    other[n - 1] = 0.0
    if rows:
        other_lp = lens_logprobs(stack, torch.stack([cast(torch.Tensor, outputs[i]) for i in rows]), rows, other_kind)
        for i, value in zip(rows, kl_to_final(final, other_lp), strict=True):
            other[i] = value
    pair = (tuple(mine), tuple(other))
    return pair if stack.kind == "logit" else pair[::-1]


def layers_started(mode: str, count: int, lens: LensSettings, layers: LayerSettings, kv_fill: str) -> LayersStarted:
    return LayersStarted(
        mode=mode, layers=count, lens_top=lens.lens_top, lens_kind=lens.lens_kind, exit_metric=layers.exit_metric,
        exit_threshold=layers.exit_threshold, min_exit_layer=layers.exit_from(count), skip_layers=layers.skip_set(),
        skip_threshold=layers.skip_threshold, kv_fill=kv_fill)
