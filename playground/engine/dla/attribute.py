"""Direct logit attribution: why token A and not B at one position, as a sum over what wrote to the residual stream.

The last layer's residual state h at the position is the embeddings plus every layer's attention output and MLP
output (plus anything a hook added, e.g. a steering vector: the layer's output minus its input minus its two
blocks). The logit difference before any soft-capping is ``(W[A] − W[B]) · norm(h) + (b[A] − b[B])``. With the
final norm's scale frozen at its value for h at this position (the standard linearisation: LayerNorm's 1/σ, RMSNorm's
1/rms), norm is linear in h, so the difference splits exactly:

    Σ_c (W[A] − W[B]) ⊙ w / σ · centre(c)  +  (W[A] − W[B]) · b + (b[A] − b[B])

over the components c (``centre`` subtracts the mean for LayerNorm, nothing for RMSNorm; w is ``1 + w`` for Gemma's
norms). The second term is the frozen norm's bias term. Each attention output splits further over its heads: the
output projection's input is the heads' outputs side by side, so head h writes ``W_O[:, h] z_h`` (GPT-2's
``Conv1D`` keeps W_O transposed); the projection's bias is its own term. Gemma's post-norms (the block outputs'
RMSNorm before the residual add) have their scale frozen too, so a head's share goes through them linearly. NeoX's
parallel residual needs nothing special: both blocks write to the same stream.

Everything is read through the model-anatomy seam (``models.anatomy``) with forward hooks on its modules, in one
forward pass over the sequence for every position asked (``attribute``), in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from playground.config.errors import ConfigError
from playground.events.dla import LINEARISATION, LogitAttribution
from playground.models.anatomy import LAYERNORM, RMS_OFFSET, Anatomy, anatomy_of


@dataclass(frozen=True)
class Request:
    """One attribution: the position whose output is read (0-based in the sequence), the run's step it stands for,
    the token A to explain and the alternative B (None: the runner-up at that position)."""

    position: int
    step: int
    token_id: int
    against_id: int | None = None


class _Capture:
    """Forward hooks on the anatomy's modules that keep, over the whole pass ([T, ...], float64): each layer's
    input and output, its attention write (heads' outputs before the output projection, and the projection's
    output or Gemma's post-norm output), its MLP write, the final norm's input and the LM head's output."""

    def __init__(self, anatomy: Anatomy) -> None:
        self.anatomy = anatomy
        n = anatomy.count
        self.layer_in: list[torch.Tensor] = [torch.empty(0)] * n
        self.layer_out: list[torch.Tensor] = [torch.empty(0)] * n
        self.heads_in: list[torch.Tensor] = [torch.empty(0)] * n  # [T, heads * head_dim]
        self.attn: list[torch.Tensor] = [torch.empty(0)] * n  # [T, hidden]: what attention adds to the stream
        self.attn_raw: list[torch.Tensor] = [torch.empty(0)] * n  # before Gemma's post-norm (= attn elsewhere)
        self.mlp: list[torch.Tensor] = [torch.empty(0)] * n
        self.final_in = torch.empty(0)
        self.logits = torch.empty(0)
        self._handles: list[Any] = []

    def __enter__(self) -> _Capture:
        a = self.anatomy
        post = a.row.post_norms
        for i in range(a.count):
            layer = a.layer(i)
            self._hook(layer.module, i, self.layer_in, self.layer_out)
            self._pre(layer.attention.output, i, self.heads_in)
            self._out(layer.attention.output, i, self.attn_raw)
            if post:  # Gemma: the block outputs go through their own RMSNorm before the residual add
                self._out(layer.module.get_submodule(post[0]), i, self.attn)
                self._out(layer.module.get_submodule(post[1]), i, self.mlp)
            else:
                self._out(layer.attention.output, i, self.attn)
                self._out(layer.mlp.module, i, self.mlp)
        self._handles.append(a.final_norm.register_forward_hook(self._keep_final))
        self._handles.append(a.lm_head.register_forward_hook(self._keep_logits))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _keep_final(self, _m: nn.Module, args: tuple, _out: Any) -> None:
        self.final_in = _first(args).double()[0]

    def _keep_logits(self, _m: nn.Module, _args: tuple, out: Any) -> None:
        self.logits = _first(out).double()[0]

    def _hook(self, module: nn.Module, i: int, inputs: list, outputs: list) -> None:
        def keep(_m: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            inputs[i] = (args[0] if args else kwargs["hidden_states"]).double()[0]
            outputs[i] = _first(out).double()[0]

        self._handles.append(module.register_forward_hook(keep, with_kwargs=True))

    def _pre(self, module: nn.Module, i: int, into: list) -> None:
        def keep(_m: nn.Module, args: tuple) -> None:
            into[i] = _first(args).double()[0]

        self._handles.append(module.register_forward_pre_hook(keep))

    def _out(self, module: nn.Module, i: int, into: list) -> None:
        def keep(_m: nn.Module, _args: tuple, out: Any) -> None:
            into[i] = _first(out).double()[0]

        self._handles.append(module.register_forward_hook(keep))


def _first(value: Any) -> torch.Tensor:
    return cast(torch.Tensor, value[0] if isinstance(value, tuple) else value)


def _eps(norm: nn.Module) -> float:
    for name in ("variance_epsilon", "eps"):
        value = getattr(norm, name, None)
        if isinstance(value, (int, float)):
            return float(value)
    raise ConfigError(f"the norm {type(norm).__name__} names no epsilon (variance_epsilon or eps): its scale "
                      "cannot be frozen for the attribution")


def _weight(norm: nn.Module, kind: str) -> torch.Tensor:
    weight = cast(torch.Tensor, norm.weight).double()
    return 1 + weight if kind == RMS_OFFSET else weight


def frozen_scale(norm: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    """[..., hidden] → [..., 1]: the norm's 1/σ (LayerNorm) or 1/rms (RMSNorm) at ``x``, the scale the
    linearisation freezes."""
    if kind == LAYERNORM:
        return torch.rsqrt(x.var(dim=-1, unbiased=False, keepdim=True) + _eps(norm))
    return torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + _eps(norm))


def _output_weight(anatomy: Anatomy, module: nn.Module) -> torch.Tensor:
    """The attention output projection's weight as [hidden, heads * head_dim] (``Conv1D`` keeps it transposed)."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise ConfigError("the attention output projection holds no float weight (a quantized copy?): per-head "
                          "attribution needs the model's own weights")
    return weight.double().T if anatomy.conv1d else weight.double()


def attribute(model: nn.Module, ids: Sequence[int], requests: Sequence[Request],
              token_text: Callable[[int], str]) -> list[LogitAttribution]:
    """Each request's attribution, from one forward pass over ``ids`` (the prompt and the generated tokens up to the
    last position asked)."""
    anatomy = anatomy_of(model)
    head = anatomy.head_weight
    if head is None:
        raise ConfigError("the LM head holds no float weight (a quantized copy?): logit attribution needs it")
    if any(not 0 <= r.position < len(ids) for r in requests):
        raise ConfigError("an attribution asks for a position outside the sequence")
    device = head.device
    with torch.inference_mode():
        with _Capture(anatomy) as seen:
            model(input_ids=torch.tensor([list(ids)], device=device), use_cache=False)
        return [_one(anatomy, seen, head, r, token_text) for r in requests]


def _one(a: Anatomy, seen: _Capture, head: torch.Tensor, r: Request, token_text: Callable[[int], str]
         ) -> LogitAttribution:
    t = r.position
    logits = seen.logits[t]  # [vocab] before the logit transform (soft-capping)
    against = r.against_id
    if against is None:
        ranked = logits.topk(2).indices.tolist()
        against = ranked[1] if ranked[0] == r.token_id else ranked[0]
    if against == r.token_id:
        raise ConfigError(f"the alternative is the token itself ({token_text(r.token_id)!r}): pick another")
    u = (head[r.token_id].double() - head[against].double())  # [hidden]
    head_bias = getattr(a.lm_head, "bias", None)
    bias_diff = float(head_bias[r.token_id] - head_bias[against]) if isinstance(head_bias, torch.Tensor) else 0.0
    kind = a.norm_kind
    final = a.final_norm
    h = seen.final_in[t]
    eff = u * _weight(final, kind) * frozen_scale(final, kind, h)[0]  # [hidden]
    norm_bias = getattr(final, "bias", None) if kind == LAYERNORM else None
    bias_term = bias_diff + (float(u @ norm_bias.double()) if isinstance(norm_bias, torch.Tensor) else 0.0)

    def dla(x: torch.Tensor) -> torch.Tensor:  # [..., hidden] → [...]
        if kind == LAYERNORM:
            x = x - x.mean(dim=-1, keepdim=True)
        return x @ eff

    post = a.row.post_norms
    attention, heads, attn_bias, mlp, other = [], [], [], [], []
    for i in range(a.count):
        layer = a.layer(i)
        out_proj = layer.attention.output
        w_o = _output_weight(a, out_proj)  # [hidden, heads * d]
        z = seen.heads_in[i][t]  # [heads * d]
        d = a.head_dim
        n_heads = z.shape[0] // d
        writes = (w_o.view(w_o.shape[0], n_heads, d) * z.view(1, n_heads, d)).sum(dim=-1).T  # [heads, hidden]
        o_bias = getattr(out_proj, "bias", None)
        bias_write = o_bias.double() if isinstance(o_bias, torch.Tensor) else torch.zeros_like(z[:1]).expand(
            w_o.shape[0])
        if post:  # Gemma: the post-norm's scale frozen at the attention output's value here
            norm = layer.module.get_submodule(post[0])
            scale = _weight(norm, RMS_OFFSET) * frozen_scale(norm, RMS_OFFSET, seen.attn_raw[i][t])
            writes, bias_write = writes * scale, bias_write * scale
        attention.append(float(dla(seen.attn[i][t])))
        heads.append(tuple(dla(writes).tolist()))
        attn_bias.append(float(dla(bias_write)))
        mlp.append(float(dla(seen.mlp[i][t])))
        rest = seen.layer_out[i][t] - seen.layer_in[i][t] - seen.attn[i][t] - seen.mlp[i][t]
        other.append(float(dla(rest)))
    embeddings = float(dla(seen.layer_in[0][t]))
    outputs = torch.stack([seen.layer_out[i][t] for i in range(a.count)])  # [layers, hidden]
    normed = final(outputs.to(head.dtype)).double()  # the lens: each layer's output through the final norm
    lens = (normed @ u + bias_diff).tolist()
    difference = float(logits[r.token_id] - logits[against])
    capped = a.logit_transform(logits[[r.token_id, against]])
    running, total = [], embeddings + bias_term
    for i in range(a.count):
        total += attention[i] + mlp[i] + other[i]
        running.append(total)
    return LogitAttribution(
        step=r.step, position=t, token_id=r.token_id, token_text=token_text(r.token_id), against_id=against,
        against_text=token_text(against), difference=difference, capped_difference=float(capped[0] - capped[1]),
        softcap=a.softcap, embeddings=embeddings, attention=tuple(attention), heads=tuple(heads),
        attention_bias=tuple(attn_bias), mlp=tuple(mlp), other=tuple(other), norm_bias=bias_term,
        running=tuple(running), lens=tuple(lens), family=a.family, linearisation=LINEARISATION)
