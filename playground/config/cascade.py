"""Cascade settings: which cheap model answers first, the confidence below which the full model takes over, and
whether that is decided per token or for the whole response."""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.catalog import Strategy, register_strategy
from playground.config.groups import SettingsGroup, register_group
from playground.config.quant import QUICK_COPIES
from playground.config.table import setting
from playground.events import TokenStep
from playground.events.cascade import CascadeResponse, CascadeStep

CHEAP_MODELS = ("quantized", "layers", "model")
CASCADE_UNITS = ("token", "response")


@register_group
@dataclass(frozen=True)
class CascadeSettings(SettingsGroup):
    name = "cascade"
    title = "Cascade"
    order = 90

    cheap: str = setting(
        "quantized", "cheap model", "who answers first: quantized = the full model's own quantized copy; layers = "
        "the full model's first layers with its final norm and LM head (early exit at a fixed layer); model = a "
        "separate small model with the same tokenizer", choices=CHEAP_MODELS)
    cascade_threshold: float = setting(
        0.5, "threshold", "the cheap model's probability for its chosen token (after the sampler pipeline) below "
        "which the full model decides instead; per response: the mean over the cheap model's response; "
        "0 = never escalate, 1 = always", minimum=0.0, maximum=1.0, step=0.05)
    cascade_unit: str = setting(
        "token", "escalate per", "token: the full model decides each token the cheap model is unsure of, first "
        "reading in one pass the tokens it missed; response: the cheap model writes the whole response, which is "
        "thrown away and rewritten by the full model when its mean confidence is below the threshold",
        choices=CASCADE_UNITS)
    cheap_quant: str = setting(
        "rtn-int4-head", "cheap quantization", "quantized cheap model: int4 weights (group 32) with an int4 LM "
        "head (about half a float32 step on this CPU), int4 weights with the float LM head (about 0.7×), or int8 "
        "per-channel weights (no faster here)", choices=QUICK_COPIES)
    cheap_layers: int = setting(0, "cheap layers", "layers cheap model: how many of the full model's first layers "
                                "run (below the last); 0 = two thirds of them", minimum=0, maximum=512,
                                off_text="⅔ of the layers")
    cheap_model: str = setting("", "cheap model path", "model cheap model: a Hugging Face folder, .gguf file or "
                               "cached model id that shares the full model's tokenizer")
    cascade_sample: bool = setting(False, "sample", "each model draws its token from its processed distribution "
                                   "(the sampling settings) with the run's seed; off: each takes its top token")
    cascade_compare: bool = setting(True, "compare with the full model", "after the run, decode as many tokens "
                                    "with the full model alone (same prompt, settings and seed) to report "
                                    "agreement and the time saved")

    def layers_for(self, layers: int) -> int:
        """The cheap model's layer count for a ``layers``-layer full model."""
        return self.cheap_layers or max(1, min(layers - 1, -(-2 * layers // 3)))

    def summary(self) -> str:
        cheap = {"quantized": self.cheap_quant, "layers": f"first {self.cheap_layers or '⅔'} layers",
                 "model": self.cheap_model or "?"}[self.cheap]
        mode = " · sampled" if self.cascade_sample else ""
        return f"{cheap} first, full model below p {self.cascade_threshold:g} per {self.cascade_unit}{mode}"

    def cross_checks(self) -> list[tuple[bool, str]]:
        return [(self.cheap != "model" or bool(self.cheap_model.strip()),
                 "the model cheap model needs --cheap-model PATH (a small model with the full model's tokenizer)")]


register_strategy(Strategy(
    "cascade", "a cheap model (the quantized copy, the first layers, a small model) answers first; the full model "
    "decides where the cheap one is unsure (per token or per response)", sections=("sampling", "penalties"),
    groups=(CascadeSettings,), step_events=(CascadeStep, CascadeResponse, TokenStep),
    runner="playground.engine.cascade.decode:run_cascade", takes_progress=True, order=100))
