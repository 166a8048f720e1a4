"""One new token through the decoder layers one at a time, so a rule can stop after any layer (early exit) or
pass a layer by (layer skipping), with the keys and values of every layer that did not run filled in.

The model's own forward pass runs (its embeddings, masks per layer type, rotary embeddings per layer type, final
norm, LM head and logit soft-capping: whatever its family does between the layers), with each decoder layer's
``forward`` wrapped for the length of the pass: a wrapped layer runs, or passes its input through unchanged. The
layers come from the model-anatomy seam, so every family in its table works the same way.

Filling (as CALM does, Schuster et al. 2022): a layer that did not run for a token still needs that token's key and
value, because later tokens attend to it there. The hidden state that reached the layer — the exit layer's output
after an early exit, the skipped layer's input otherwise — goes through the layer's own attention-input norm and
attention module, with the mask, rotary embedding and cache the model handed that layer: the module's own code
computes the keys and values (fused or separate projections, q/k norms, partial rotary), writes them to the cache,
and its output is dropped. The cost is one attention block per filled layer instead of the whole layer.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import nn

from playground.engine.layers.lens import LayerStack, entropy_bits, relative_update

KV_FILL = ("keys and values of layers that did not run come from the hidden state that reached them, through the "
           "layer's own input norm and attention (CALM's propagation; the attention's output is dropped)")

# (layer index, relative update of the last layer that ran, whether the layer before was skipped) -> skip?
SkipRule = Callable[[int, float | None, bool], bool]


@dataclass
class TokenPass:
    """What one token's pass through the layers produced."""

    logits: torch.Tensor  # [1, vocab] raw logits of the answering layer
    outputs: list[torch.Tensor | None]  # per layer: its output at this position [hidden], None if it did not run
    updates: list[float | None]  # per layer: ‖Δh‖ / ‖h‖
    exit_layer: int | None  # 1-based, None when the last layer answered
    skipped: tuple[int, ...]  # 1-based
    lens_rows: dict[int, torch.Tensor] = field(default_factory=dict)  # 0-based layer -> lens log-probs [vocab]
    # computed on the way (early exit's checks)
    forward_ms: float = 0.0
    filled: list[int] = field(default_factory=list)  # 0-based layers whose keys/values were filled


@dataclass
class _Pass:
    """The state of one token's pass, shared by the wrapped layers."""

    n: int
    exit_rule: ExitRule | None
    skip_rule: SkipRule | None
    outputs: list[torch.Tensor | None]
    updates: list[float | None]
    skipped: list[int] = field(default_factory=list)
    filled: list[int] = field(default_factory=list)
    rows: dict[int, torch.Tensor] = field(default_factory=dict)
    exit_layer: int | None = None
    last_update: float | None = None


class LayerLoop:
    def __init__(self, model: nn.Module, precision: str = "model", kind: str = "logit") -> None:
        # kind: the lens the exit rules read (logit or tuned); ConfigError naming the family if it cannot be opened up
        self.stack = LayerStack.of(model, precision, kind)
        assert self.stack.anatomy is not None  # LayerStack.of opens the model up (or raises)
        self.anatomy = self.stack.anatomy
        self.model = model
        self._blocks = [self.anatomy.layer(i).attention for i in range(self.stack.count)]
        self._signatures = [inspect.signature(layer.forward) for layer in self.stack.layers]
        attention = inspect.signature(self._blocks[0].module.forward).parameters
        self._attention_params = set(attention)
        self._attention_any = any(p.kind is p.VAR_KEYWORD for p in attention.values())

    def run(self, token_id: int, cache: object, exit_rule: ExitRule | None = None,
            skip_rule: SkipRule | None = None) -> TokenPass:
        """The token at the next position through the layers, reading and extending ``cache`` at every layer.

        ``exit_rule`` is asked only where an exit is allowed: a lens check costs an LM-head product (for SmolLM2,
        as many multiply-adds as 8 layers)."""
        start = time.perf_counter()
        n = self.stack.count
        state = _Pass(n, exit_rule, skip_rule, [None] * n, [None] * n)
        device = cast(torch.Tensor, self.anatomy.embed.weight).device
        with self._wrapped(state):
            out = self.model(input_ids=torch.tensor([[token_id]], device=device), cache=cache, use_cache=True)
        logits = out.logits[:, -1, :].float()  # [1, vocab]: final norm, head and transform on the answering state
        ran = [i for i, o in enumerate(state.outputs) if o is not None]
        answering = state.exit_layer - 1 if state.exit_layer is not None else max(ran)
        state.rows.setdefault(answering, logits[0].log_softmax(dim=-1))  # the answer's lens is its own distribution
        return TokenPass(logits, state.outputs, state.updates, state.exit_layer, tuple(state.skipped), state.rows,
                         (time.perf_counter() - start) * 1000, state.filled)

    @contextmanager
    def _wrapped(self, state: _Pass) -> Iterator[None]:
        layers = list(self.stack.layers)
        for i, layer in enumerate(layers):
            layer.forward = self._layer_forward(i, layer.forward, state)  # an instance attribute shadows the method
        try:
            yield
        finally:
            for layer in layers:
                del layer.forward

    def _layer_forward(self, i: int, original: Callable, state: _Pass) -> Callable:
        def forward(hidden: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
            if state.exit_layer is not None:  # the layers after the exit: keys and values from the exit state
                self.fill(i, hidden, args, kwargs)
                state.filled.append(i)
                return hidden
            previous_skipped = bool(state.skipped) and state.skipped[-1] == i
            if state.skip_rule is not None and state.skip_rule(i, state.last_update, previous_skipped):
                self.fill(i, hidden, args, kwargs)
                state.skipped.append(i + 1)
                state.filled.append(i)
                return hidden
            out = original(hidden, *args, **kwargs)
            h = out[0] if isinstance(out, tuple) else out
            state.outputs[i] = h[0, -1]
            state.updates[i] = state.last_update = relative_update(hidden[0, -1], h[0, -1])
            rule = state.exit_rule
            if rule is not None and rule.min_layer - 1 <= i < state.n - 1:
                row = None
                if rule.needs_lens:
                    row = state.rows[i] = self.stack.lens_logits(h[0, -1:], [i]).log_softmax(dim=-1)[0]  # [vocab]
                if rule.passes(row, hidden[0, -1], h[0, -1]):
                    state.exit_layer = i + 1
            return out

        return forward

    def fill(self, index: int, h: torch.Tensor, args: tuple, kwargs: dict) -> None:
        """Keys and values of layer ``index`` for this position, from the hidden state ``h`` [1, 1, hidden]: the
        layer's attention block on its input norm of ``h``, with the arguments the model gave the layer."""
        layer = self.stack.layers[index]
        bound = self._signatures[index].bind(h, *args, **kwargs).arguments
        names = list(bound)
        passed: dict[str, object] = {}
        for name in names[1:]:  # the first is the hidden state
            value = bound[name]
            if isinstance(value, dict) and self._signatures[index].parameters[name].kind is \
                    inspect.Parameter.VAR_KEYWORD:
                passed.update(value)
            else:
                passed[name] = value
        if not self._attention_any:
            passed = {k: v for k, v in passed.items() if k in self._attention_params}
        block = self._blocks[index]
        del layer  # the block's modules are the layer's own
        block.module(block.norm(h), **passed)


@dataclass(frozen=True)
class ExitRule:
    """Exit at the first layer (1-based ≥ ``min_layer``) whose lens entropy ≤ threshold bits ("entropy"), whose
    lens top probability ≥ threshold ("max-prob"), or whose output's cosine similarity with its input ≥ threshold
    ("saturation": the layer barely turned the residual stream, CALM's hidden-state saturation — no LM head)."""

    metric: str
    threshold: float
    min_layer: int

    @property
    def needs_lens(self) -> bool:
        return self.metric != "saturation"

    def passes(self, logprobs: torch.Tensor | None, h_in: torch.Tensor, h_out: torch.Tensor) -> bool:
        if self.metric == "saturation":
            return float(torch.cosine_similarity(h_in.float(), h_out.float(), dim=0)) >= self.threshold
        assert logprobs is not None
        if self.metric == "entropy":
            return float(entropy_bits(logprobs[None])[0]) <= self.threshold
        return float(logprobs.max().exp()) >= self.threshold


def skip_rule(fixed: tuple[int, ...], threshold: float, count: int) -> SkipRule:
    """Skip the fixed 1-based layers; and, with ``threshold`` > 0, a layer after one whose relative residual update
    was below it — never two in a row by that rule, never the first or the last layer."""
    fixed_set = {layer - 1 for layer in fixed}

    def skip(index: int, last_update: float | None, previous_skipped: bool) -> bool:
        if index in fixed_set:
            return True
        if threshold <= 0 or index in (0, count - 1) or previous_skipped or last_update is None:
            return False
        return last_update < threshold

    return skip
