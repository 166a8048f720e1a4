"""One new token through the decoder layers one at a time, so a rule can stop after any layer (early exit) or
pass a layer by (layer skipping), with the keys and values of every layer that did not run filled in.

Filling (as CALM does, Schuster et al. 2022): a layer that did not run for a token still needs that token's key and
value, because later tokens attend to it there. We project the hidden state that reached the layer — the exit
layer's output after an early exit, the skipped layer's input otherwise — through that layer's input norm and its
key/value projections (with the rotary position of the token). The cost is two small matrix products per layer
instead of the layer's attention and MLP.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers.masking_utils import create_causal_mask

from playground.config import ConfigError
from playground.engine.layers.lens import LayerStack, entropy_bits, relative_update

KV_FILL = ("keys and values of layers that did not run come from the hidden state that reached them, through the "
           "layer's input norm and key/value projections (CALM's propagation)")

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


class LayerLoop:
    def __init__(self, model: torch.nn.Module, precision: str = "model") -> None:
        self.stack = LayerStack.of(model, precision)
        inner = model.model
        self.embed = getattr(inner, "embed_tokens", None)
        self.rotary = getattr(inner, "rotary_emb", None)
        attn = getattr(self.stack.layers[0], "self_attn", None)
        parts = (self.embed, self.rotary, attn, getattr(attn, "k_proj", None), getattr(attn, "v_proj", None),
                 getattr(self.stack.layers[0], "input_layernorm", None), getattr(attn, "head_dim", None))
        self._rope = getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)
        if any(p is None for p in parts) or self._rope is None:
            raise ConfigError(f"early exit and layer skipping run the layers one by one and need a Llama-like model "
                              f"(embed_tokens, rotary_emb, self_attn.k_proj/v_proj, input_layernorm); "
                              f"{type(model).__name__} has another shape")
        self.config = model.config

    def run(self, token_id: int, cache: object, exit_rule: ExitRule | None = None,
            skip_rule: SkipRule | None = None) -> TokenPass:
        """The token at the next position through the layers, reading and extending ``cache`` at every layer.

        ``exit_rule`` is asked only where an exit is allowed: a lens check costs an LM-head product (for SmolLM2,
        as many multiply-adds as 8 layers)."""
        start = time.perf_counter()
        device = self.stack.lm_head.weight.device
        h = self.embed(torch.tensor([[token_id]], device=device))  # [1, 1, hidden]
        position = cache.get_seq_length()
        position_ids = torch.tensor([[position]], device=device)
        rope = self.rotary(h, position_ids=position_ids)
        mask = create_causal_mask(config=self.config, inputs_embeds=h, attention_mask=None, cache=cache,
                                  position_ids=position_ids)
        n = self.stack.count
        outputs: list[torch.Tensor | None] = [None] * n
        updates: list[float | None] = [None] * n
        skipped: list[int] = []
        filled: list[int] = []
        rows: dict[int, torch.Tensor] = {}
        exit_layer = None
        last_update: float | None = None
        for i, layer in enumerate(self.stack.layers):
            if skip_rule is not None and skip_rule(i, last_update, bool(skipped) and skipped[-1] == i):
                self.fill(i, h, rope, cache)
                skipped.append(i + 1)
                filled.append(i)
                continue
            h_in = h
            h = layer(h, attention_mask=mask, position_ids=position_ids, cache=cache, use_cache=True,
                      position_embeddings=rope)
            outputs[i] = h[0, -1]
            updates[i] = last_update = relative_update(h_in[0, -1], h[0, -1])
            if exit_rule is not None and exit_rule.min_layer - 1 <= i < n - 1:
                row = None
                if exit_rule.needs_lens:
                    row = rows[i] = self.stack.lens_logits(h[0, -1:]).log_softmax(dim=-1)[0]  # [vocab]
                if exit_rule.passes(row, h_in[0, -1], h[0, -1]):
                    exit_layer = i + 1
                    for j in range(i + 1, n):  # the layers after the exit: keys and values from the exit state
                        self.fill(j, h, rope, cache)
                        filled.append(j)
                    break
        logits = self.stack.lm_head(self.stack.norm(h[:, -1, :])).float()  # [1, vocab]
        answering = exit_layer - 1 if exit_layer is not None else max(i for i, o in enumerate(outputs) if o is not None)
        rows.setdefault(answering, logits[0].log_softmax(dim=-1))  # the answer's lens is its own distribution
        return TokenPass(logits, outputs, updates, exit_layer, tuple(skipped), rows,
                         (time.perf_counter() - start) * 1000, filled)

    def fill(self, index: int, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: object) -> None:
        """Keys and values of layer ``index`` for this position, from the hidden state ``h`` [1, 1, hidden]."""
        layer = self.stack.layers[index]
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        shape = (1, 1, -1, attn.head_dim)
        keys = attn.k_proj(x).view(shape).transpose(1, 2)  # [1, kv_heads, 1, head_dim]
        values = attn.v_proj(x).view(shape).transpose(1, 2)
        k_norm = getattr(attn, "k_norm", None)  # models that normalise keys (Qwen3) do it before the rotation
        if k_norm is not None:
            keys = k_norm(keys)
        cos, sin = rope
        _, keys = self._rope(keys, keys, cos, sin)
        cache.update(keys, values, index)


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
