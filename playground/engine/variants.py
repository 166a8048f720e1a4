"""Cheaper variants of a loaded model, made in one place and kept in one cache.

What the speculative drafter, the contrastive amateur, the cascade's cheap model and ``--quant`` run instead of (or
beside) the loaded model, asked for with one typed request:

- ``FirstLayers(n)``: its first n decoder layers with its final norm, LM head and logit transform, sharing every
  weight (shallow copies down to the decoder stack, whose layer list and config are cut to n);
- ``QuantizedCopy(method, ...)``: a deep copy whose decoder projections are quantized (the reference is untouched);
  the quick copies the drafter, amateur and cheap model choose from (``QuantizedCopy.quick``) and ``--quant``'s
  (``QuantizedCopy.of``) are the same requests where they are the same recipe, so they share one copy;
- ``SmallModel(path)``: a separate small model with the loaded model's tokenizer, on its device and dtype.

``variant(lm, request, context)`` returns the cached variant or builds it, reporting through the run's context
(``progress(message, fraction)``); its Stop at any progress point of a build raises ``BuildStopped`` and keeps
nothing.
``detail(variant, whose)`` says what a variant is in a few words.

The cache is keyed by (the loaded model, the request). It holds its models weakly: a variant goes when the model it
was made from is freed (another model loaded). It keeps at most one quantized copy per model and method (another
group size or α of the same method replaces it, freed before the new one is built) and at most ``QUANTIZED_COPIES``
quantized copies in all (the least recently used goes first), and one small model.
"""

from __future__ import annotations

import copy
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import torch
from torch import nn

from playground.config import ConfigError, ModelSettings, QuantSettings
from playground.config.quant import QUICK_COPIES
from playground.engine.run_context import NO_CONTEXT, Progress, RunContext
from playground.errors import UserError
from playground.models.anatomy import anatomy_of
from playground.models.loaded import LoadedModel

QUANTIZED_COPIES = 2  # quantized copies kept in all (each is about a model's size)
HEAD = "rtn-int4-head"  # the quick recipe that quantizes the LM head too (a quarter of a step's multiply-adds)
RTN_METHODS = ("rtn-int8", "rtn-int8-asym", "rtn-int4", "zeroquant")  # built by quantize_model, no calibration
GROUPWISE = ("rtn-int4", "zeroquant", "awq")  # the others quantize per output channel
CALIBRATED = ("smoothquant", "awq")
QUICK_GROUP = 32  # the quick copies' group size (torch's int4 kernel pays at it)
QUICK_WORDS = {  # what each of the settings' QUICK_COPIES holds, for its detail
    "rtn-int4": "int4 weights (group 32, torch's int4 kernel), float LM head",
    HEAD: "int4 weights and LM head (group 32, torch's int4 kernel)",
    "rtn-int8": "int8 per-channel weights",
}


@dataclass(frozen=True)
class FirstLayers:
    kind: ClassVar[str] = "layers"
    layers: int
    setting: str = field(default="draft_layers", compare=False)  # the option a range error names


@dataclass(frozen=True)
class QuantizedCopy:
    kind: ClassVar[str] = "quantized"
    method: str
    group_size: int | None = None  # None: per output channel
    smooth_alpha: float | None = None  # SmoothQuant only
    calibration_tokens: int | None = None  # the calibrated methods only (SmoothQuant, AWQ)

    @classmethod
    def quick(cls, method: str) -> QuantizedCopy:
        """The drafter's, amateur's or cheap model's copy: ``rtn-int4`` / ``rtn-int4-head`` in groups of 32, or
        ``rtn-int8`` per channel (``--quant rtn-int4 --group-size 32`` and ``--quant rtn-int8`` are the same)."""
        if method not in QUICK_COPIES:
            raise ConfigError(f"quantized copy must be one of {', '.join(QUICK_COPIES)}, not {method!r}")
        return cls(method, QUICK_GROUP if method != "rtn-int8" else None)

    @classmethod
    def of(cls, quant: QuantSettings) -> QuantizedCopy:
        """``--quant``'s copy: the parameters a method does not use are left out (rtn-int8 at any group size is one
        copy); the calibration tokens count only where they decide the weights."""
        method = quant.quant
        return cls(method, quant.group_size if method in GROUPWISE else None,
                   quant.smooth_alpha if method == "smoothquant" else None,
                   quant.calibration_tokens if method in CALIBRATED else None)


@dataclass(frozen=True)
class SmallModel:
    kind: ClassVar[str] = "model"
    path: str


VariantRequest = FirstLayers | QuantizedCopy | SmallModel


@dataclass
class Variant:
    request: VariantRequest
    model: nn.Module
    source_layers: int  # the loaded model's decoder layers
    loaded: LoadedModel | None = None  # a small model as loaded (its name, tokenizer, context length)
    # A quantized copy: how it was made, for the --quant description (input and row scales, calibration stats).
    input_scales: dict = field(default_factory=dict)
    row_scales: dict = field(default_factory=dict)
    stats: dict | None = None
    notes: dict = field(default_factory=dict)  # what others derived from it (--quant's QuantReady), kept with it

    @property
    def kind(self) -> str:
        return self.request.kind


class BuildStopped(UserError):
    """Stop came while a variant was being built: nothing was kept. ``cut`` names it for ``RunFinished.cut_short``
    ("quantized_copy", or "small_model" for a separate small model's load). Not a ``ConfigError``: the strategies
    that reword a small model's refusals (the amateur's, the cheap model's) let it through to their Stop path."""

    def __init__(self, message: str, cut: str = "quantized_copy") -> None:
        super().__init__(message)
        self.cut = cut


def label(request: VariantRequest) -> str:
    """The request in a few words ("first 8 layers", "rtn-int4 g32", "smoothquant α=0.5", a model's path)."""
    if isinstance(request, FirstLayers):
        return f"first {request.layers} layers"
    if isinstance(request, SmallModel):
        return request.path
    if request.method == HEAD:
        return HEAD
    group = f" g{request.group_size}" if request.method in GROUPWISE else ""
    alpha = f" α={request.smooth_alpha:g}" if request.method == "smoothquant" else ""
    return f"{request.method}{group}{alpha}"


def detail(variant: Variant, whose: str) -> str:
    """What the variant is, for its run's start event; ``whose``: the loaded model as the strategy calls it ("the
    target", "the expert", its name)."""
    request = variant.request
    if isinstance(request, FirstLayers):
        return (f"the first {request.layers} of {variant.source_layers} layers of {whose} + its final norm and "
                "LM head")
    if isinstance(request, SmallModel):
        name = variant.loaded.name if variant.loaded is not None else request.path
        return f"{name} ({cast(Any, variant.model).num_parameters() / 1e6:.0f}M parameters)"
    return f"{whose} with {QUICK_WORDS.get(request.method) or label(request)}"


# --- the cache ---------------------------------------------------------------------------------------------------

@dataclass
class _Entry:
    source: weakref.ref  # the loaded model: an id can be reused once a model is freed, the object cannot
    variant: Variant


_ENTRIES: dict[tuple[int, VariantRequest], _Entry] = {}  # least recently used first
_LOCK = threading.RLock()


def _forget(source: weakref.ref) -> None:
    """The weak reference's callback: its model was freed, so are its variants."""
    with _LOCK:
        for key in [k for k, e in _ENTRIES.items() if e.source is source]:
            _ENTRIES.pop(key, None)


def cached(lm: LoadedModel, request: VariantRequest) -> Variant | None:
    """The variant if the cache holds it (it then counts as used)."""
    key = (id(lm.model), request)
    with _LOCK:
        entry = _ENTRIES.get(key)
        if entry is None or entry.source() is not lm.model:
            return None
        _ENTRIES[key] = _ENTRIES.pop(key)  # most recently used last
        return entry.variant


def held(lm: LoadedModel | None = None, kind: type | None = None) -> list[Variant]:
    """The variants the cache holds (of ``lm``'s model, or all; of one request type, or all), least recently used
    first."""
    with _LOCK:
        return [e.variant for key, e in _ENTRIES.items()
                if (lm is None or e.source() is lm.model) and (kind is None or isinstance(key[1], kind))]


def clear(kind: type | None = None) -> None:
    """Drop every cached variant (of one request type)."""
    with _LOCK:
        for key in [k for k in _ENTRIES if kind is None or isinstance(k[1], kind)]:
            _ENTRIES.pop(key, None)


def _make_room(lm: LoadedModel, request: VariantRequest) -> None:
    """Free what the new variant replaces before it is built: the same method's other copy of this model and the
    least recently used copies beyond the limit; any other small model."""
    with _LOCK:
        if isinstance(request, SmallModel):
            drop = [k for k in _ENTRIES if isinstance(k[1], SmallModel)]
        elif isinstance(request, QuantizedCopy):
            copies = [k for k in _ENTRIES if isinstance(k[1], QuantizedCopy)]
            drop = [k for k in copies if k[0] == id(lm.model) and cast(QuantizedCopy, k[1]).method == request.method]
            others = [k for k in copies if k not in drop]
            drop += others[: max(0, len(others) - (QUANTIZED_COPIES - 1))]
        else:
            drop = []
        for key in drop:
            _ENTRIES.pop(key, None)


def variant(lm: LoadedModel, request: VariantRequest, context: RunContext = NO_CONTEXT) -> Variant:
    """The variant of ``lm`` that ``request`` names: from the cache, or built and kept.

    ``ConfigError`` when it cannot be made for this model (before any work where that can be known);
    ``BuildStopped`` when the context's Stop said so at a progress point of the build (nothing is kept); a small model
    that cannot be loaded raises ``ModelLoadError``.
    """
    found = cached(lm, request)
    if found is not None:
        return found
    if isinstance(request, QuantizedCopy):  # a copy this model cannot have frees nothing
        _targets(lm.model, request.method)
    _make_room(lm, request)
    built = build(lm, request, context)
    with _LOCK:
        _ENTRIES[(id(lm.model), request)] = _Entry(weakref.ref(lm.model, _forget), built)
    return built


def quantized_copy(lm: LoadedModel, method: str) -> nn.Module:
    """The model of ``lm``'s quick quantized copy (``QuantizedCopy.quick``), from the cache or built."""
    return variant(lm, QuantizedCopy.quick(method)).model


# --- the builder -------------------------------------------------------------------------------------------------

def build(lm: LoadedModel, request: VariantRequest, context: RunContext = NO_CONTEXT) -> Variant:
    """A new variant (not cached; ``variant`` keeps what it builds)."""
    if isinstance(request, FirstLayers):
        model = first_layers(lm.model, request.layers, request.setting)
        return Variant(request, model, anatomy_of(lm.model).count)
    if isinstance(request, SmallModel):
        small = load_small_model(lm, request.path, context)
        return Variant(request, small.model, 0, loaded=small)
    with torch.no_grad():
        return _quantized(lm, request, build_reporter(label(request), lm.name, context))


def build_reporter(what: str, model_name: str, context: RunContext = NO_CONTEXT) -> Progress:
    """``say(message, fraction)`` for a build of ``what``: reports ``"what: message"`` (fraction clamped to 0..1)
    through the context and raises ``BuildStopped`` when its Stop has come, so nothing half-built is kept."""

    def say(message: str, fraction: float) -> None:
        context.report(f"{what}: {message}", min(max(fraction, 0.0), 1.0))
        if context.stopped():
            raise BuildStopped(f"stopped while building the {what} copy of {model_name}: nothing was kept")

    return say


def first_layers(model: nn.Module, n_layers: int, setting: str = "draft_layers") -> nn.Module:
    """The model's first ``n_layers`` decoder layers with its final norm, LM head and logit transform, sharing
    every weight: the causal LM and the modules down to its decoder stack are shallow copies whose layer list and
    config are cut to ``n_layers`` (the model's own forward then runs them, as it runs the whole model)."""
    anatomy = anatomy_of(model)  # ConfigError naming the family when it cannot be opened up
    total = anatomy.count
    if not 1 <= n_layers < total:
        raise ConfigError(f"{setting} must be between 1 and {total - 1} for this {total}-layer model "
                          f"(got {n_layers})")
    config: Any = copy.copy(cast(Any, model).config)  # a transformers model's
    text = config.get_text_config(decoder=True)
    if text is not config:  # a multimodal wrapper: cut a copy of its text config, held by the wrapper's copy
        for name, value in list(vars(config).items()):
            if value is text:
                text = copy.copy(text)
                setattr(config, name, text)
    text.num_hidden_layers = n_layers
    if isinstance(getattr(text, "layer_types", None), list):
        text.layer_types = text.layer_types[:n_layers]
    draft = _shallow(model, config)
    parent = draft
    for name in anatomy.base_path.split("."):  # copy each module down to the decoder stack
        child = _shallow(getattr(parent, name), text if name == anatomy.base_path.split(".")[-1] else None)
        setattr(parent, name, child)
        parent = child
    setattr(parent, anatomy.row.layers, nn.ModuleList(list(anatomy.layers)[:n_layers]))
    return draft


def _shallow(module: nn.Module, config: Any) -> nn.Module:
    twin = copy.copy(module)
    twin._modules = dict(module._modules)
    if config is not None and hasattr(twin, "config"):
        twin.config = config
    return twin


def load_small_model(lm: LoadedModel, path: str, context: RunContext = NO_CONTEXT) -> LoadedModel:
    """A separate model on ``lm``'s device and dtype that must share its tokenizer (``ConfigError`` if not).

    Stop is honoured between the load's phases (before the tokenizer, before the weights, before the move to the
    device, at the end): ``BuildStopped`` ("small_model"), and the half-loaded model goes with it."""
    from playground.models.loading import load_model

    def say(message: str, fraction: float) -> None:
        context.report(message, fraction)
        if context.stopped():
            raise BuildStopped(f"stopped while loading the small model {path} for {lm.name}: nothing was kept",
                               cut="small_model")

    small = load_model(ModelSettings(path=path, device=lm.device.type, dtype=lm.dtype_name), say)
    if small.tokenizer.get_vocab() != lm.tokenizer.get_vocab():
        raise ConfigError(f"the draft model {small.name} does not share {lm.name}'s tokenizer: token ids would "
                          "mean different things; pick a draft model of the same family")
    return small


def _quantized(lm: LoadedModel, request: QuantizedCopy, say: Progress) -> Variant:
    """The quantized copy of ``lm.model`` that ``request`` names; ``say(message, fraction)`` at each step of the
    build (Stop is honoured there)."""
    from playground.engine.quant import diagnostics
    from playground.engine.quant.linear import quantize_model, replaced_linears

    method, model = request.method, lm.model
    base = "rtn-int4" if method == HEAD else method
    anatomy, targets = _targets(model, method)  # ConfigError naming the family before any work
    per_layer = len(anatomy.layer(0).linears())
    layers = -(-len(targets) // per_layer)
    head = method == HEAD
    started = time.perf_counter()
    stats = None
    input_scales: dict = {}
    row_scales: dict = {}
    if base in RTN_METHODS:
        def layer_done(done: int, total: int) -> None:  # one report per decoder layer, not per linear
            if head and done == total:
                say("quantizing the LM head", 1.0)
            elif done % per_layer == 0 or done == len(targets):
                say(f"quantizing layer {-(-done // per_layer)}/{layers}", done / total)

        say(f"quantizing {layers} layers", 0.0)
        # kernel "auto": torch's low-bit kernels where they pay on the CPU, the dequantized path elsewhere
        quantized = quantize_model(model, base, request.group_size, quantize_lm_head=head, progress=layer_done)
    elif base == "naive-w8a8":
        from playground.engine.quant.smoothquant import naive_w8a8

        say("quantizing weights to int8", 0.0)
        quantized = naive_w8a8(model)
    elif base == "smoothquant":
        from playground.engine.quant.calibration import activation_stats, load_text
        from playground.engine.quant.smoothquant import smooth_model, to_w8a8

        tokens = min(request.calibration_tokens or 512, lm.context_length)
        say(f"measuring activations on {tokens} calibration tokens", 0.0)
        stats = activation_stats(model, lm.tokenizer, load_text("calibration"), tokens)
        assert request.smooth_alpha is not None  # a SmoothQuant copy names its α
        say(f"smoothing (α={request.smooth_alpha:g}) and quantizing to W8A8", 0.1)
        smoothed, factors = smooth_model(model, stats, request.smooth_alpha)
        quantized = to_w8a8(smoothed)
        input_scales = diagnostics.smoothquant_input_scales(model, factors)
    elif base == "awq":
        from playground.engine.quant.awq import AwqResult, awq
        from playground.engine.quant.calibration import load_text

        results: list[AwqResult] = []
        tokens = min(request.calibration_tokens or 512, lm.context_length)
        say(f"capturing the layers' inputs on {tokens} calibration tokens", 0.0)
        quantized = awq(model, lm.tokenizer, load_text("calibration"), group_size=request.group_size,
                        max_tokens=tokens, progress=say, results=results)
        input_scales, row_scales = diagnostics.awq_scales_by_linear(model, results)
    else:
        raise ConfigError(f"unknown quantization method {method!r}")
    quantized = quantized.eval()
    replaced = len(replaced_linears(quantized))  # each builder refused a copy short of its targets
    if replaced != len(targets):
        raise ConfigError(f"{base} replaced {replaced} of the {len(targets)} decoder projections of this "
                          f"{anatomy.family} model: the copy would not be what its label says")
    say("preparing its kernels", 1.0)
    _warm(quantized, lm.device)
    say(f"built in {time.perf_counter() - started:.1f} s", 1.0)
    return Variant(request, quantized, anatomy.count, input_scales=input_scales, row_scales=row_scales, stats=stats)


def _targets(model: nn.Module, method: str) -> tuple[Any, list]:
    """The model's anatomy and the projections a quantized copy replaces (``ConfigError`` naming the family)."""
    from playground.engine.quant.targets import quant_targets

    return quant_targets(model, "rtn-int4" if method == HEAD else method)


def _warm(model: Any, device: torch.device) -> None:
    """One token through a new quantized copy: its layers build their kernel layouts on first use (a few hundred
    ms on SmolLM2), which is part of making the copy, not of the first run's prompt."""
    model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), use_cache=False)
