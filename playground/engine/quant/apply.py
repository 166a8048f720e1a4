"""``--quant METHOD`` for any strategy: the loaded model's quantized copy, built once and kept, and what it is.

``quantized_lm`` builds the copy for one method (and group size, SmoothQuant α, calibration tokens), measures it
(per-linear weight error, per-channel activation scales of a few layers, perplexity of both models on the shipped
evaluation text) and keeps it in memory: the next run with the same model and method reuses it (``cached=True``).
One copy is kept at a time, so switching methods frees the previous one before building the next.

``run_quantized`` runs a strategy's runner on that copy and inserts the ``QuantReady`` right after its
``RunStarted`` (a trace still starts with ``start``).
"""

from __future__ import annotations

import dataclasses
import json
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from playground.config import ConfigError, QuantSettings, RunSettings, SpeculativeSettings
from playground.engine.quant import diagnostics
from playground.engine.quant.awq import AwqResult, InputScaledLinear, awq
from playground.engine.quant.calibration import activation_stats, load_text, text_ids
from playground.engine.quant.linear import QuantLinear, model_weight_bytes, quantize_model, replaced_linears
from playground.engine.quant.metrics import perplexity
from playground.engine.quant.smoothquant import naive_w8a8, smooth_model, to_w8a8
from playground.engine.quant.targets import quant_targets
from playground.events import RunStarted
from playground.events.quant import QuantReady
from playground.models.anatomy import LAYERNORM, RMS_OFFSET, Anatomy
from playground.models.loaded import LoadedModel

Progress = Callable[[str, float], None]
StopCheck = Callable[[], bool]

RTN_METHODS = ("rtn-int8", "rtn-int8-asym", "rtn-int4", "zeroquant")  # built by quantize_model, no calibration
GROUPWISE = ("rtn-int4", "zeroquant", "awq")  # the others quantize per output channel
CALIBRATED = ("smoothquant", "awq")
EVAL_TOKENS = 256  # of the evaluation text, for the perplexities (a quick figure, not a benchmark)
STORED = {  # how each method's decoder linears are held (all are QuantLinears: codes + float32 scales)
    "rtn-int8": "int8", "rtn-int8-asym": "int8 + zero points", "rtn-int4": "packed int4",
    "zeroquant": "int8 (group-wise)", "naive-w8a8": "int8 (per channel)",
    "smoothquant": "int8 (per channel, smoothed)", "awq": "packed int4 (AWQ-scaled)"}


class QuantCancelled(ConfigError):
    """Stop was pressed while the quantized copy was being built: nothing was kept."""


@dataclass
class _Entry:
    key: tuple
    source: weakref.ref  # the reference model: an id can be reused once a model is freed, the object cannot
    lm: LoadedModel
    ready: QuantReady


_CACHE: list[_Entry] = []  # at most one quantized copy in memory


def cache_key(lm: LoadedModel, quant: QuantSettings) -> tuple:
    """What decides the copy: parameters a method does not use are left out (rtn-int8 at any group size is one
    copy). The calibration tokens count for every method: they decide the channel statistics shown with it."""
    method = quant.quant
    return (id(lm.model), method, quant.group_size if method in GROUPWISE else None,
            quant.smooth_alpha if method == "smoothquant" else None, quant.calibration_tokens)


def _cached(lm: LoadedModel, key: tuple) -> _Entry | None:
    entry = _CACHE[0] if _CACHE else None
    if entry is not None and entry.key == key and entry.source() is lm.model:
        return entry
    return None


def is_cached(lm: LoadedModel, quant: QuantSettings) -> bool:
    return _cached(lm, cache_key(lm, quant)) is not None


def clear_cache() -> None:
    _CACHE.clear()


def label(quant: QuantSettings) -> str:
    """The method in a few words ("rtn-int4 g128", "smoothquant α=0.5")."""
    return dataclasses.replace(quant, compare=False).summary()


def reference_note(lm: LoadedModel) -> str:
    """A caveat when the float reference is itself dequantized from a quantized file (the default model)."""
    path = Path(lm.path)
    if path.suffix.lower() == ".gguf":
        return (f"The float reference is itself dequantized from the GGUF file {path.name}: errors are measured "
                "against it, not against the original training weights.")
    from playground.models.default_model import MARKER

    try:
        source = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return ""
    gguf = str(source.get("gguf", "")) if isinstance(source, dict) else ""
    if "Q4_1" in gguf:
        return ("The float reference is itself dequantized from a Q4_1 GGUF (4-bit, groups of 32, with a minimum): "
                "errors and perplexity gaps here are measured against it, not against the original bf16 weights, "
                "so they understate the full cost of quantization (asymmetric int4 in groups of 32 would reproduce "
                "it exactly).")
    return f"The float reference was converted from {gguf}." if gguf else ""


@dataclass
class _Built:
    model: Any
    stored: str
    input_scales: diagnostics.Scales  # per linear: its quantized weights see x / s
    row_scales: diagnostics.Scales  # per linear: output rows divided by s after quantization (AWQ's up_proj)


def _build(lm: LoadedModel, quant: QuantSettings, stats: dict, tokens: int, say: Progress,
           anatomy: Anatomy) -> _Built:
    """The quantized copy of ``lm.model``; ``say(message, fraction of this stage)``."""
    method, model = quant.quant, lm.model
    if method in RTN_METHODS:
        group = quant.group_size if method in GROUPWISE else None
        per_layer = len(anatomy.layer(0).linears())

        def layer_done(done: int, total: int) -> None:  # one report per decoder layer, not per linear
            if done % per_layer == 0 or done == total:
                say(f"quantizing layer {-(-done // per_layer)}/{-(-total // per_layer)}", done / total)

        # kernel "auto": torch's low-bit kernels where they pay on the CPU, the dequantized path elsewhere
        quantized = quantize_model(model, method, group, progress=layer_done)
        return _Built(quantized, STORED[method], {}, {})
    if method == "naive-w8a8":
        say("quantizing weights to int8", 0.0)
        return _Built(naive_w8a8(model), STORED[method], {}, {})
    if method == "smoothquant":
        say(f"smoothing (α={quant.smooth_alpha:g}) and quantizing to W8A8", 0.0)
        smoothed, factors = smooth_model(model, stats, quant.smooth_alpha)
        return _Built(to_w8a8(smoothed), STORED[method], diagnostics.smoothquant_input_scales(model, factors), {})
    if method == "awq":
        results: list[AwqResult] = []
        quantized = awq(model, lm.tokenizer, load_text("calibration"), group_size=quant.group_size,
                        max_tokens=tokens, progress=lambda message, fraction: say(message, fraction),
                        results=results)
        inputs, rows = diagnostics.awq_scales_by_linear(model, results)
        return _Built(quantized, STORED[method], inputs, rows)
    raise ConfigError(f"unknown quantization method {method!r}")


def _norms(anatomy: Anatomy) -> str:
    if anatomy.norm_kind == RMS_OFFSET:
        return f"{anatomy.family}'s (1 + w) RMSNorm weights (w -> (1 + w) / s - 1)"
    if anatomy.norm_kind == LAYERNORM:
        return "the LayerNorm weights and biases"
    return "the RMSNorm weights"


def _labels(anatomy: Anatomy) -> dict[str, str]:
    """Each projection's path under a layer -> its name in a sentence: the last part ("q_proj") unless two share it
    (GPT-2's attn.c_proj and mlp.c_proj), then the path."""
    paths = [path for path, _ in anatomy.layer(0).linears()]
    last = [path.rpartition(".")[2] for path in paths]
    return {path: name if last.count(name) == 1 else path for path, name in zip(paths, last, strict=True)}


def _notes(lm: LoadedModel, quant: QuantSettings, model: Any, anatomy: Anatomy, replaced: int) -> str:
    parts = [reference_note(lm)]
    linears = [m for m in model.modules() if isinstance(m, QuantLinear)]
    layer, label = anatomy.layer(0), _labels(anatomy)
    attn_in = "/".join(label[p] for p, _, _ in layer.attention.inputs)
    mlp_in = "/".join(label[p] for p, _, _ in layer.mlp.inputs)
    o_name, down_name = label[layer.attention.output_path], label[layer.mlp.output_path]
    parts.append(f"All {replaced} decoder projections of this {anatomy.family} model ({anatomy.count} layers x "
                 f"{attn_in}, {o_name}, {mlp_in}, {down_name}) are stored {STORED[quant.quant]}"
                 + ("; its Conv1D projections became nn.Linear (transposed) first." if anatomy.conv1d else "."))
    if quant.quant == "smoothquant":
        parts.append(f"SmoothQuant's division of the inputs is folded into {_norms(anatomy)} before {attn_in} "
                     f"and {mlp_in}; {o_name} and {down_name} are quantized unsmoothed.")
    if quant.quant == "awq":
        parts.append(_awq_note(model, anatomy, label))
    if any(m.activation_quant for m in linears):
        if any(m.kernel == "int8mm" for m in linears):
            parts.append("Activations are quantized to int8 per token on every call and multiplied with the int8 "
                         "weights on torch's integer matmul (int8 x int8 -> int32).")
        else:
            parts.append("Activations are quantized to int8 per token on every call; the int8 product is emulated "
                         "in float.")
    if any(m.kernel == "int4pack" for m in linears):
        parts.append("The large int4 layers run on torch's int4 kernel, which rounds their inputs to bfloat16.")
    if any(m.kernel == "dequant" for m in linears):
        parts.append("Layers no low-bit kernel serves here run from a float32 copy of their dequantized weights, "
                     "made on first use and not counted in the weight bytes.")
    parts.append(f"Embeddings and LM head stay {lm.dtype_name}.")
    return " ".join(p for p in parts if p)


def _awq_note(model: Any, anatomy: Anatomy, label: dict[str, str]) -> str:
    """Where AWQ's scales went in this family: the norms, up's rows (gated MLPs), or input scales kept in front."""
    layer = anatomy.layer(0)
    attn, mlp = layer.attention, layer.mlp
    attn_in, mlp_in = "/".join(label[p] for p, _, _ in attn.inputs), "/".join(label[p] for p, _, _ in mlp.inputs)
    note = f"AWQ's division of the inputs is folded into {_norms(anatomy)} ({attn_in}; {mlp_in})"
    up = next(((path, parts) for path, _, parts in mlp.inputs if "up" in parts), None)
    if anatomy.row.gated_mlp and up is not None:
        rows = label[up[0]] if up[1] == ("up",) else f"the up rows of {label[up[0]]}"
        note += f" and into the previous linear's int4 row scales ({label[mlp.output_path]}'s into {rows})"
    separate_v = any(parts == ("v",) for _, _, parts in attn.inputs)
    reasons = {attn.output_path: "grouped-query attention: it cannot be folded into v_proj" if separate_v
               else "q/k/v are one fused linear: v's rows are not a linear of their own",
               mlp.output_path: "the MLP is not gated: its activation sits between the two linears"}
    kept = [path for path in reasons if isinstance(model.get_submodule(anatomy.linear_name(0, path)),
                                                   InputScaledLinear)]
    return note + "." + "".join(f" {label[path]} keeps its own as a float32 vector in front of it ({reasons[path]})."
                                for path in kept)


def quantized_lm(lm: LoadedModel, quant: QuantSettings, progress: Progress | None = None, *,
                 should_stop: StopCheck | None = None) -> tuple[LoadedModel, QuantReady]:
    """The loaded model's quantized copy for ``quant`` (built once, then from the cache) and its description.

    ``progress(message, fraction)`` reports calibration, quantization and measurement; ``should_stop`` is polled
    at each report and ends the build with ``QuantCancelled``. The reference model is not changed.
    """
    if quant.quant == "none":
        raise ConfigError("no quantization method chosen: --quant none decodes with the model as loaded")
    quant.validate()
    key = cache_key(lm, quant)
    entry = _cached(lm, key)
    if entry is not None:
        return entry.lm, dataclasses.replace(entry.ready, seconds=0.0, cached=True)
    _CACHE.clear()  # free the previous copy before building the next
    stop = should_stop or (lambda: False)

    def say(message: str, fraction: float) -> None:
        if progress is not None:
            progress(f"{label(quant)}: {message}", min(max(fraction, 0.0), 1.0))
        if stop():
            raise QuantCancelled(f"stopped while building the {label(quant)} copy of {lm.name}: nothing was kept")

    started = time.perf_counter()
    model = lm.model
    anatomy, targets = quant_targets(model, quant.quant)  # ConfigError naming the family before any work
    tokens = min(quant.calibration_tokens, lm.context_length)
    with torch.no_grad():
        say(f"measuring activations on {tokens} calibration tokens", 0.0)
        stats = activation_stats(model, lm.tokenizer, load_text("calibration"), tokens)
        built = _build(lm, quant, stats, tokens, lambda message, f: say(message, 0.05 + 0.8 * f), anatomy)
        quantized = built.model.eval()
        replaced = len(replaced_linears(quantized))  # each builder refused a copy short of its targets
        if replaced != len(targets):
            raise ConfigError(f"{quant.quant} replaced {replaced} of the {len(targets)} decoder projections of this "
                              f"{anatomy.family} model: the copy would not be what its label says")
        say("measuring weight errors", 0.86)
        errors = diagnostics.layer_errors(model, quantized, built.input_scales, built.row_scales)
        channels = diagnostics.channel_scales(stats, diagnostics.representative_linears(model), built.input_scales)
        say("perplexity on the evaluation text", 0.9)
        eval_ids = text_ids(lm.tokenizer, load_text("evaluation"), min(EVAL_TOKENS, lm.context_length))
        scores = {"reference": perplexity(model, eval_ids), quant.quant: perplexity(quantized, eval_ids)}
    seconds = time.perf_counter() - started
    say(f"ready in {seconds:.1f} s", 1.0)
    ready = QuantReady(
        method=quant.quant, group_size=quant.group_size if quant.quant in GROUPWISE else None, stored=built.stored,
        reference_dtype=lm.dtype_name, reference_weight_bytes=model_weight_bytes(model),
        weight_bytes=model_weight_bytes(quantized), seconds=seconds, cached=False,
        note=_notes(lm, quant, quantized, anatomy, replaced), layer_errors=errors, channels=channels, perplexity=scores)
    qlm = dataclasses.replace(lm, model=quantized, name=f"{lm.name} · {label(quant)}")
    _CACHE.append(_Entry(key, weakref.ref(model), qlm, ready))
    return qlm, ready


def check_combination(settings: RunSettings) -> None:
    """Refuse what cannot be run on a quantized copy, before anything is built."""
    spec = settings.group(SpeculativeSettings)
    if settings.strategy == "speculative" and spec.draft == "quantized":
        raise ConfigError(
            "--quant with the quantized drafter would draft with a quantized copy of the already quantized target "
            "(for RTN methods that copy is the target itself, so every draft would be accepted): pick another "
            "drafter, or drop --quant and let --draft-quant choose the drafter's quantization")


def run_quantized(runner: Callable[..., Iterator[Any]], lm: LoadedModel, settings: RunSettings,
                  should_stop: StopCheck | None = None, progress: Progress | None = None) -> Iterator[Any]:
    """``runner`` on the quantized copy of ``lm`` (``settings``' QuantSettings), ``QuantReady`` after its start.

    The strategy's own checks run first on the reference (same tokenizer and shape), so a bad setting is refused
    before a build that can take a minute; the build itself happens here, before the generator is returned."""
    check_combination(settings)
    quant = settings.group(QuantSettings)
    if not is_cached(lm, quant):
        _close(runner(lm, settings, should_stop))
    qlm, ready = quantized_lm(lm, quant, progress, should_stop=should_stop)
    return _with_ready(runner(qlm, settings, should_stop), ready)


def _close(events: Any) -> None:
    close = getattr(events, "close", None)
    if close is not None:
        close()


def _with_ready(events: Iterator[Any], ready: QuantReady) -> Iterator[Any]:
    inserted = False
    try:
        for event in events:
            yield event
            if not inserted and isinstance(event, RunStarted):
                inserted = True
                yield ready
    finally:
        _close(events)
