"""What a model family's parts are: the one place that knows module names.

Capabilities that open a model up (the lens, the layer loop, first-N-layers variants, quantization, KV geometry) ask
``anatomy_of(model)`` instead of probing ``model.model.layers`` or ``self_attn.q_proj`` themselves. The answer is an
``Anatomy`` (typed handles on the model's own modules) or a ``ConfigError`` that names the family and why.

A family is a row of ``FAMILIES``: where its decoder, layers, embeddings and final norm live, the kind of its norms,
and for each layer which norm feeds which projections (separate, fused, or GPT-2's transposed ``Conv1D``). The rows
were read from transformers' modelling code and checked against AutoAWQ's per-family classes (which norm scales
which linears) and TransformerLens's weight conversions (fused layouts, parallel residuals). A further Llama-like or
GPT-like family is a new row, not a new code path.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from playground.config.errors import ConfigError

# Norm kinds: what dividing a norm's *output* by s means for its parameters (``scale_norm_output``).
RMS = "rms"  # x / rms(x) * w
RMS_OFFSET = "rms+1"  # x / rms(x) * (1 + w)  (Gemma)
LAYERNORM = "layernorm"  # (x - mean) / std * w + b

FULL = "full_attention"
SLIDING = "sliding_attention"


@dataclass(frozen=True)
class Projection:
    """A linear (or ``Conv1D``) reading a block's input; ``parts`` name what its output rows are, in order."""

    path: str  # under the decoder layer, e.g. "self_attn.q_proj"
    parts: tuple[str, ...]  # ("q",), ("q", "k", "v"), ("gate", "up"), ("fc",)


@dataclass(frozen=True)
class BlockRow:
    """One half of a decoder layer: the norm that feeds it, the projections reading that norm's output, and the
    projection that writes the block's output."""

    module: str  # "self_attn", "attn", "attention", "mlp"
    norm: str  # the norm whose output is the block's input
    inputs: tuple[Projection, ...]
    output: str  # "self_attn.o_proj", "mlp.down_proj", ...


@dataclass(frozen=True)
class FamilyRow:
    name: str  # shown to users
    bases: tuple[str, ...]  # where the decoder stack lives under the causal LM (first that exists)
    layers: str
    embed: str
    final_norm: str
    norm_kind: str
    attention: BlockRow
    mlp: BlockRow
    positions: str | None = None  # learned position embeddings (GPT-2)
    post_norms: tuple[str, ...] = ()  # norms of a block's output before the residual add (Gemma 2/3)
    parallel_residual: bool | str = False  # True, or the config attribute that says so (NeoX)
    conv1d: bool = False  # projections are GPT-2's Conv1D (weight [in, out])
    gated_mlp: bool = True  # mlp(x) = down(act(gate(x)) * up(x)): up's rows can absorb a scale of down's input
    fused_qkv: str | None = None  # "blocks" (q | k | v, Phi-3 / GPT-2) or "per-head" (NeoX: [head][q k v])


_SEPARATE_QKV = (Projection("self_attn.q_proj", ("q",)), Projection("self_attn.k_proj", ("k",)),
                 Projection("self_attn.v_proj", ("v",)))
_LLAMA_ATTENTION = BlockRow("self_attn", "input_layernorm", _SEPARATE_QKV, "self_attn.o_proj")
_LLAMA_MLP = BlockRow("mlp", "post_attention_layernorm",
                      (Projection("mlp.gate_proj", ("gate",)), Projection("mlp.up_proj", ("up",))), "mlp.down_proj")
_LLAMA = FamilyRow("Llama", ("model",), "layers", "embed_tokens", "norm", RMS, _LLAMA_ATTENTION, _LLAMA_MLP)
_GEMMA = FamilyRow("Gemma 2", ("model.language_model", "model"), "layers", "embed_tokens", "norm", RMS_OFFSET,
                   _LLAMA_ATTENTION,
                   BlockRow("mlp", "pre_feedforward_layernorm", _LLAMA_MLP.inputs, "mlp.down_proj"),
                   post_norms=("post_attention_layernorm", "post_feedforward_layernorm"))

# model_type -> row. Qwen2 (q/k/v bias), Qwen3 (q/k norms inside attention), Mistral (sliding window) share
# Llama's layout; what differs (biases, per-layer windows, head norms) is read from the modules and the config.
FAMILIES: dict[str, FamilyRow] = {
    "llama": _LLAMA,
    "mistral": dataclasses.replace(_LLAMA, name="Mistral"),
    "qwen2": dataclasses.replace(_LLAMA, name="Qwen2"),
    "qwen3": dataclasses.replace(_LLAMA, name="Qwen3"),
    "gemma2": _GEMMA,
    "gemma3_text": dataclasses.replace(_GEMMA, name="Gemma 3"),
    "gemma3": dataclasses.replace(_GEMMA, name="Gemma 3"),
    "phi3": FamilyRow(
        "Phi-3", ("model",), "layers", "embed_tokens", "norm", RMS,
        BlockRow("self_attn", "input_layernorm", (Projection("self_attn.qkv_proj", ("q", "k", "v")),),
                 "self_attn.o_proj"),
        BlockRow("mlp", "post_attention_layernorm", (Projection("mlp.gate_up_proj", ("gate", "up")),),
                 "mlp.down_proj"),
        fused_qkv="blocks"),
    "gpt2": FamilyRow(
        "GPT-2", ("transformer",), "h", "wte", "ln_f", LAYERNORM,
        BlockRow("attn", "ln_1", (Projection("attn.c_attn", ("q", "k", "v")),), "attn.c_proj"),
        BlockRow("mlp", "ln_2", (Projection("mlp.c_fc", ("fc",)),), "mlp.c_proj"),
        positions="wpe", conv1d=True, gated_mlp=False, fused_qkv="blocks"),
    "gpt_neox": FamilyRow(
        "GPT-NeoX", ("gpt_neox",), "layers", "embed_in", "final_layer_norm", LAYERNORM,
        BlockRow("attention", "input_layernorm", (Projection("attention.query_key_value", ("q", "k", "v")),),
                 "attention.dense"),
        BlockRow("mlp", "post_attention_layernorm", (Projection("mlp.dense_h_to_4h", ("fc",)),),
                 "mlp.dense_4h_to_h"),
        parallel_residual="use_parallel_residual", gated_mlp=False, fused_qkv="per-head"),
}


def supported_families() -> list[str]:
    """The families' display names, each once, in table order."""
    return list(dict.fromkeys(row.name for row in FAMILIES.values()))


@dataclass(frozen=True)
class Block:
    """A resolved block of one layer: the modules themselves."""

    module: nn.Module
    norm: nn.Module
    norm_path: str
    inputs: tuple[tuple[str, nn.Module, tuple[str, ...]], ...]  # (path under the layer, module, parts)
    output_path: str
    output: nn.Module


@dataclass(frozen=True)
class Layer:
    index: int
    module: nn.Module
    attention: Block
    mlp: Block
    layer_type: str  # FULL or SLIDING
    window: int | None  # tokens a sliding layer attends to; None for full attention

    def linears(self) -> list[tuple[str, nn.Module]]:
        """Every projection of the layer (path under the layer, module), attention first, in forward order."""
        found = [(p, m) for p, m, _ in self.attention.inputs] + [(self.attention.output_path, self.attention.output)]
        found += [(p, m) for p, m, _ in self.mlp.inputs] + [(self.mlp.output_path, self.mlp.output)]
        return found


@dataclass
class Anatomy:
    """A model's parts, resolved from its family's row. Module handles are the model's own (no copies)."""

    family: str  # display name, e.g. "Gemma 2"
    model_type: str
    row: FamilyRow
    model: nn.Module
    base: nn.Module
    base_path: str
    layers: nn.ModuleList
    embed: nn.Module
    positions: nn.Module | None
    final_norm: nn.Module
    lm_head: nn.Module
    tied: bool
    softcap: float | None  # final logit soft-capping: c * tanh(logits / c)
    layer_types: tuple[str, ...]
    windows: tuple[int | None, ...]
    kv_heads: int
    head_dim: int
    parallel_residual: bool
    rotary: nn.Module | None
    _layers: list[Layer] = field(default_factory=list, repr=False)

    @property
    def count(self) -> int:
        return len(self.layers)

    @property
    def norm_kind(self) -> str:
        return self.row.norm_kind

    @property
    def conv1d(self) -> bool:
        return self.row.conv1d

    @property
    def layers_path(self) -> str:
        return f"{self.base_path}.{self.row.layers}"

    @property
    def has_sliding_layers(self) -> bool:
        return SLIDING in self.layer_types

    def layer(self, index: int) -> Layer:
        if not self._layers:
            self._layers = [self._resolve_layer(i) for i in range(self.count)]
        return self._layers[index]

    def all_layers(self) -> list[Layer]:
        return [self.layer(i) for i in range(self.count)]

    def linear_name(self, index: int, path: str) -> str:
        """A projection's full module name, as ``named_modules`` spells it (``model.layers.3.mlp.up_proj``)."""
        return f"{self.layers_path}.{index}.{path}"

    def logit_transform(self, logits: torch.Tensor) -> torch.Tensor:
        """What the model does to the LM head's output (Gemma 2's soft-capping); identity for most families."""
        if self.softcap:
            return torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @property
    def head_weight(self) -> torch.Tensor | None:
        """The LM head's float weight [vocab, hidden]; None when the head holds no float ``weight`` (a quantized
        copy's head is a ``QuantLinear``: codes and scales): apply ``lm_head`` itself then."""
        weight = getattr(self.lm_head, "weight", None)
        return weight if isinstance(weight, torch.Tensor) and weight.is_floating_point() else None

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm, LM head and the logit transform on residual-stream states [..., hidden]: the model's own
        output for its last layer's state, the logit lens for any other layer's."""
        return self.logit_transform(self.lm_head(self.final_norm(hidden)))

    def _resolve_layer(self, index: int) -> Layer:
        layer = self.layers[index]
        blocks = []
        for row in (self.row.attention, self.row.mlp):
            inputs = tuple((p.path, _get(layer, p.path, self.family), p.parts) for p in row.inputs)
            blocks.append(Block(_get(layer, row.module, self.family), _get(layer, row.norm, self.family), row.norm,
                                inputs, row.output, _get(layer, row.output, self.family)))
        return Layer(index, layer, blocks[0], blocks[1], self.layer_types[index], self.windows[index])


def _get(root: nn.Module, path: str, family: str) -> nn.Module:
    try:
        return root.get_submodule(path)
    except AttributeError as error:
        raise ConfigError(f"this {family} model has no {path!r} where its family keeps it: its layout differs from "
                          f"the {family} row of the model-anatomy table") from error


def _first_base(model: nn.Module, row: FamilyRow) -> tuple[str, nn.Module]:
    for path in row.bases:
        try:
            base = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(getattr(base, row.layers, None), nn.ModuleList):
            return path, base
    raise ConfigError(f"this {row.name} model has no decoder layers at {' or '.join(row.bases)}.{row.layers}")


def _layer_types(config: Any, count: int) -> tuple[tuple[str, ...], tuple[int | None, ...]]:
    """Each layer's attention type and window, from the config (Gemma 2/3, Qwen2 list ``layer_types``; Mistral
    slides every layer when ``sliding_window`` is set)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if isinstance(types, (list, tuple)) and len(types) >= count:
        types = tuple(SLIDING if t == SLIDING else FULL for t in types[:count])
    elif isinstance(window, int) and window > 0 and getattr(config, "use_sliding_window", True):
        types = (SLIDING,) * count
    else:
        types = (FULL,) * count
    if SLIDING in types and not (isinstance(window, int) and window > 0):
        types = (FULL,) * count  # a config that names sliding layers without a window attends fully
    return types, tuple(window if t == SLIDING else None for t in types)


def model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "model_type", "") or type(model).__name__)


def family_name(model: nn.Module) -> str:
    """The display name of the model's family, or its model type when the table has no row for it."""
    row = FAMILIES.get(model_type(model))
    return row.name if row is not None else model_type(model)


def anatomy_of(model: nn.Module) -> Anatomy:
    """The model's parts, or ``ConfigError`` naming the family and why it cannot be opened up."""
    kind = model_type(model)
    row = FAMILIES.get(kind)
    if row is None:
        known = ", ".join(supported_families())
        raise ConfigError(f"the {type(model).__name__} family ({kind!r}) is not in the model-anatomy table, so views "
                          f"that open the model up (layers, quantization, speculative and KV labs) cannot read it; "
                          f"supported families: {known}. Greedy, sampling and beam search still work")
    base_path, base = _first_base(model, row)
    layers = getattr(base, row.layers)
    lm: Any = model  # a transformers model: its config and heads are not nn.Module's
    config = lm.config.get_text_config(decoder=True) if hasattr(lm.config, "get_text_config") else lm.config
    head = lm.get_output_embeddings()
    embed = _get(base, row.embed, row.name)
    if head is None:
        raise ConfigError(f"this {row.name} model has no LM head")
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    types, windows = _layer_types(config, len(layers))
    parallel = row.parallel_residual
    if isinstance(parallel, str):
        parallel = bool(getattr(config, parallel, False))
    softcap = getattr(config, "final_logit_softcapping", None)
    return Anatomy(
        family=row.name, model_type=kind, row=row, model=model, base=base, base_path=base_path, layers=layers,
        embed=embed, positions=_get(base, row.positions, row.name) if row.positions else None,
        final_norm=_get(base, row.final_norm, row.name), lm_head=head,
        tied=getattr(head, "weight", None) is getattr(embed, "weight", 0), softcap=float(softcap) if softcap else None,
        layer_types=types, windows=windows, kv_heads=kv_heads, head_dim=head_dim, parallel_residual=bool(parallel),
        rotary=getattr(base, "rotary_emb", None))


def scale_norm_output(norm: nn.Module, kind: str, s: torch.Tensor) -> None:
    """Change ``norm``'s parameters (in place) so that its output is divided by ``s`` per channel, exactly:
    RMSNorm w -> w / s; Gemma's (1 + w) -> (1 + w) / s, so w -> (1 + w) / s - 1; LayerNorm w, b -> w / s, b / s."""
    with torch.no_grad():
        weight, bias = cast(torch.Tensor, norm.weight), getattr(norm, "bias", None)
        if kind == RMS_OFFSET and weight.dtype != torch.float32:
            # w' = (1 + w) / s - 1 sits near -1 for a large s: in bfloat16 that keeps ~2 bits of 1 + w'. Gemma's
            # norms compute (1 + w.float()) in float32 anyway, so hold w in float32 (a few KB per norm).
            weight.data = weight.data.float()
        s = s.to(weight)
        if kind == RMS_OFFSET:
            weight.copy_((1 + weight.double()) / s.double() - 1)
        else:
            weight.div_(s)
        if kind == LAYERNORM and bias is not None:
            bias.div_(s.to(bias))


def part_rows(anatomy: Anatomy, parts: tuple[str, ...], part: str, out_features: int) -> torch.Tensor:
    """The output rows of a fused projection that hold ``part`` ("q", "k", "v", "gate", "up"), as an index tensor.

    Blocks: q | k | v (Phi-3's qkv_proj, GPT-2's c_attn) or gate | up (Phi-3's gate_up_proj); per-head: NeoX's
    query_key_value, [head][q k v] with head_dim rows each."""
    if parts == (part,):
        return torch.arange(out_features)
    if parts == ("gate", "up"):
        half = out_features // 2
        return torch.arange(half) if part == "gate" else torch.arange(half, out_features)
    if parts != ("q", "k", "v"):
        raise ValueError(f"no part {part!r} in {parts}")
    d, q_rows, kv_rows = anatomy.head_dim, out_features - 2 * anatomy.kv_heads * anatomy.head_dim, \
        anatomy.kv_heads * anatomy.head_dim
    which = "qkv".index(part)
    if anatomy.row.fused_qkv == "per-head":
        heads = out_features // (3 * d)
        return torch.arange(heads * 3 * d).view(heads, 3, d)[:, which].reshape(-1)
    start = (0, q_rows, q_rows + kv_rows)[which]
    return torch.arange(start, start + (q_rows if part == "q" else kv_rows))


@dataclass(frozen=True)
class KVLayout:
    """What a decoder's attention layers keep per token, read from a config alone (caches are built from one):
    each layer's type (FULL or SLIDING), its window (None for full attention), and the KV geometry."""

    layer_types: tuple[str, ...]
    windows: tuple[int | None, ...]
    kv_heads: int
    head_dim: int

    @property
    def count(self) -> int:
        return len(self.layer_types)


def kv_layout(config: Any) -> KVLayout:
    """The ``KVLayout`` of a model config (its decoder's text config for multimodal ones): the same layer types and
    windows ``anatomy_of`` gives, which are those transformers' ``DynamicCache(config=...)`` builds its layers from."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    types, windows = _layer_types(text, int(text.num_hidden_layers))
    return KVLayout(layer_types=types, windows=windows, kv_heads=kv_heads, head_dim=head_dim)


# What opens the model up, by the names users see, and what each one gates in the settings form: strategies that
# cannot run at all without the seam, and settings groups / switches.
CAPABILITIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "logit lens": ((), ("lens",)),
    "early exit and layer skip": (("early-exit", "layer-skip"), ()),
    "first-layers drafter, amateur and cheap model": ((), ()),
    "quantization lab": ((), ("quant",)),
    "KV lab": ((), ()),
}


@dataclass(frozen=True)
class ModelSupport:
    """What the loaded model supports: its family, and per capability None (supported) or why not."""

    family: str
    reasons: dict[str, str | None]

    @property
    def blocked_strategies(self) -> dict[str, str]:
        return {s: why for cap, why in self.reasons.items() if why for s in CAPABILITIES[cap][0]}

    @property
    def blocked_groups(self) -> dict[str, str]:
        return {g: why for cap, why in self.reasons.items() if why for g in CAPABILITIES[cap][1]}

    def summary(self) -> str:
        blocked = [cap for cap, why in self.reasons.items() if why]
        if not blocked:
            return f"{self.family}: every view supported"
        return f"{self.family}: {len(blocked)} of {len(self.reasons)} capabilities need another family"

    def details(self) -> str:
        return "\n".join(f"{cap}: {'supported' if why is None else 'not supported — ' + why}"
                         for cap, why in self.reasons.items())


def model_support(model: nn.Module) -> ModelSupport:
    """Per capability of ``CAPABILITIES``: supported, or the reason (the anatomy's refusal, which names the
    family). Every family of the table supports every capability (tests/test_families.py is the matrix); outside
    it, the KV lab still runs, since it needs only the config's KV geometry (``kv_layout``)."""
    try:
        anatomy = anatomy_of(model)
    except ConfigError as error:
        reasons: dict[str, str | None] = {cap: str(error) for cap in CAPABILITIES}
        try:
            kv_layout(model.config)
            reasons["KV lab"] = None
        except (AttributeError, TypeError, ValueError):  # a config without the KV geometry: the refusal stands
            pass
        return ModelSupport(family_name(model), reasons)
    return ModelSupport(anatomy.family, {cap: None for cap in CAPABILITIES})


def layer_count(model: nn.Module) -> int:
    """How many decoder layers the model has: the anatomy's, else its config's (families outside the table)."""
    try:
        return anatomy_of(model).count
    except ConfigError:
        config: Any = getattr(model, "config", None)
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        return int(getattr(text, "num_hidden_layers", 0) or 0)
