"""``--quant METHOD`` for any strategy: the loaded model's quantized copy, built once and kept, and what it is.

``quantized_lm`` takes the copy for one method (and group size, SmoothQuant α, calibration tokens) from the
variants' cache, where it is built once (``playground.engine.variants``: the same copy the drafter, the amateur and
the cheap model use where theirs is the same recipe), measures it (per-linear weight error, per-channel activation
scales of a few layers, perplexity of both models on the shipped evaluation text) and keeps that description with
the copy: the next run with the same model and method reuses both (``cached=True``). The cache keeps one copy per
model and method, so another group size of a method frees the previous copy before building the next.

``run_quantized`` runs a strategy's runner on that copy and inserts the ``QuantReady`` right after its
``RunStarted`` (a trace still starts with ``start``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from playground.config import ConfigError, QuantSettings, RunSettings, SpeculativeSettings
from playground.config.catalog import get_strategy
from playground.engine import variants
from playground.engine.prompt import encode_prompt
from playground.engine.quant import diagnostics
from playground.engine.quant.awq import InputScaledLinear
from playground.engine.quant.calibration import activation_stats, load_text, text_ids
from playground.engine.quant.linear import STORED, QuantLinear, model_weight_bytes, replaced_linears
from playground.engine.quant.metrics import perplexity
from playground.engine.quant.targets import quant_targets
from playground.engine.run_context import NO_CONTEXT, RunContext, StopCheck
from playground.engine.run_events import RunRecorder
from playground.engine.variants import GROUPWISE, BuildStopped, QuantizedCopy
from playground.events import RunStarted
from playground.events.quant import QuantReady
from playground.models.anatomy import LAYERNORM, RMS_OFFSET, Anatomy
from playground.models.loaded import LoadedModel

EVAL_TOKENS = 256  # of the evaluation text, for the perplexities (a quick figure, not a benchmark)
QuantCancelled = BuildStopped  # Stop was pressed while the quantized copy was being built: nothing was kept


def _request(quant: QuantSettings) -> QuantizedCopy:
    return QuantizedCopy.of(quant)


def _ready_key(quant: QuantSettings) -> tuple:
    """What decides the description beyond the copy: the calibration tokens decide the channel statistics shown
    with every method."""
    return ("quant_ready", quant.calibration_tokens)


def is_cached(lm: LoadedModel, quant: QuantSettings) -> bool:
    """The copy and its description are both cached: a run takes them without any work."""
    copy = variants.cached(lm, _request(quant))
    return copy is not None and _ready_key(quant) in copy.notes


def clear_cache() -> None:
    """Drop every quantized copy (and the descriptions kept with them)."""
    variants.clear(QuantizedCopy)


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


def quantized_lm(lm: LoadedModel, quant: QuantSettings, context: RunContext = NO_CONTEXT
                 ) -> tuple[LoadedModel, QuantReady]:
    """The loaded model's quantized copy for ``quant`` (built once, then from the cache) and its description.

    The context's ``progress(message, fraction)`` reports calibration, quantization and measurement; its Stop is
    polled at each report and ends the build with ``QuantCancelled`` (nothing half-built is kept; a copy already built
    stays, its description is measured again next time). The reference model is not changed.
    """
    if quant.quant == "none":
        raise ConfigError("no quantization method chosen: --quant none decodes with the model as loaded")
    quant.validate()
    request = _request(quant)
    copy = variants.cached(lm, request)
    if copy is not None and _ready_key(quant) in copy.notes:
        ready = copy.notes[_ready_key(quant)]
        return _named(lm, quant, copy), dataclasses.replace(ready, seconds=0.0, cached=True)
    say = variants.build_reporter(label(quant), lm.name, context)
    started = time.perf_counter()
    model = lm.model
    anatomy, _ = quant_targets(model, quant.quant)  # ConfigError naming the family before any work
    tokens = min(quant.calibration_tokens, lm.context_length)
    with torch.no_grad():
        building = RunContext.of(context, lambda message, f: context.report(message, 0.8 * f))  # the build: 0..0.8
        copy = variants.variant(lm, request, building)
        quantized = copy.model
        replaced = len(replaced_linears(quantized))  # the builder refused a copy short of its targets
        stats = copy.stats  # SmoothQuant's build measured them on the same tokens
        if stats is None:
            say(f"measuring activations on {tokens} calibration tokens", 0.8)
            stats = activation_stats(model, lm.tokenizer, load_text("calibration"), tokens)
        say("measuring weight errors", 0.86)
        errors = diagnostics.layer_errors(model, quantized, copy.input_scales, copy.row_scales)
        channels = diagnostics.channel_scales(stats, diagnostics.representative_linears(model), copy.input_scales)
        say("perplexity on the evaluation text", 0.9)
        eval_ids = text_ids(lm.tokenizer, load_text("evaluation"), min(EVAL_TOKENS, lm.context_length))
        scores = {"reference": perplexity(model, eval_ids), quant.quant: perplexity(quantized, eval_ids)}
    seconds = time.perf_counter() - started
    say(f"ready in {seconds:.1f} s", 1.0)
    ready = QuantReady(
        method=quant.quant, group_size=quant.group_size if quant.quant in GROUPWISE else None,
        stored=STORED[quant.quant], reference_dtype=lm.dtype_name, reference_weight_bytes=model_weight_bytes(model),
        weight_bytes=model_weight_bytes(quantized), seconds=seconds, cached=False,
        note=_notes(lm, quant, quantized, anatomy, replaced), layer_errors=errors, channels=channels, perplexity=scores)
    copy.notes[_ready_key(quant)] = ready
    return _named(lm, quant, copy), ready


def _named(lm: LoadedModel, quant: QuantSettings, copy: Any) -> LoadedModel:
    named = dataclasses.replace(lm, model=copy.model, name=f"{lm.name} · {label(quant)}", base_name=lm.own_name)
    named.history = copy.notes.setdefault("run_history", named.history)  # the copy's earlier runs, kept with it
    return named


def check_combination(settings: RunSettings) -> None:
    """Refuse what cannot be run on a quantized copy, before anything is built."""
    spec = settings.group(SpeculativeSettings)
    if settings.strategy == "speculative" and spec.draft == "quantized":
        raise ConfigError(
            "--quant with the quantized drafter would draft with a quantized copy of the already quantized target "
            "(for RTN methods that copy is the target itself, so every draft would be accepted): pick another "
            "drafter, or drop --quant and let --draft-quant choose the drafter's quantization")


def run_quantized(runner: Callable[..., Iterator[Any]], lm: LoadedModel, settings: RunSettings,
                  context: RunContext | StopCheck | None = None) -> Iterator[Any]:
    """``runner`` on the quantized copy of ``lm`` (``settings``' QuantSettings), ``QuantReady`` after its start.

    The strategy's own checks run first on the reference (same tokenizer and shape), so a bad setting is refused
    before a build that can take a minute; the build itself happens here, before the generator is returned. Stop
    during the build returns a run that starts and ends "stopped" with ``cut_short=("quantized_copy",)``."""
    context = RunContext.of(context)
    check_combination(settings)
    quant = settings.group(QuantSettings)
    if not is_cached(lm, quant):
        _close(runner(lm, settings, context))
    try:
        qlm, ready = quantized_lm(lm, quant, context)
    except BuildStopped as stopped:  # the run ends "stopped", saying what Stop cut
        prompt_ids, prompt_text = encode_prompt(lm, settings)
        record = RunRecorder(lm, settings, context, groups=get_strategy(settings.strategy).groups)
        return record.stopped_before_start(prompt_ids, prompt_text, (stopped.cut,))
    return _with_ready(runner(qlm, settings, context), ready)


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
