"""Contrastive decoding settings (Li et al. 2022): who the amateur is, the plausibility cut α, and how the token is
chosen from the contrast scores log p_expert − log p_amateur."""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.catalog import Strategy, register_strategy
from playground.config.groups import SettingsGroup, register_group
from playground.config.quant import QUICK_COPIES
from playground.config.table import setting
from playground.events import TokenStep
from playground.events.contrastive import ContrastStep

AMATEURS = ("layer", "dola", "quantized", "model")
DOLA_VARIANTS = ("reference", "formula")


@register_group
@dataclass(frozen=True)
class ContrastiveSettings(SettingsGroup):
    name = "contrastive"
    title = "Contrastive decoding"
    order = 40

    amateur: str = setting(
        "layer", "amateur", "whose mistakes are subtracted: layer = an early layer of the expert itself (its output "
        "through the final norm and LM head, from the same forward pass, as DoLa contrasts layers); quantized = the "
        "expert's quantized copy; model = a separate smaller model with the same tokenizer; dola = DoLa (Chuang et al. "
        "2023): per token, the layer of --dola-layers whose next-token distribution differs most from the final "
        "layer's (how: --dola-variant)", choices=AMATEURS)
    alpha: float = setting(0.1, "plausibility α", "only tokens with p_expert ≥ α × the expert's top probability "
                           "may be chosen (the plausibility cut); 0 = every token the expert allows, 1 = only "
                           "the expert's top token (plain greedy)", minimum=0.0, maximum=1.0, step=0.01,
                           decimals=3)
    amateur_temperature: float = setting(1.0, "amateur temperature", "divide the amateur's logits by this before "
                                         "its softmax: >1 flattens the amateur (a weaker penalty), <1 sharpens it",
                                         minimum=0.0, above_minimum=True, widget_maximum=10.0, step=0.1)
    amateur_layer: int = setting(0, "amateur layer", "layer amateur: the expert's layer whose output is the "
                                 "amateur (1-based, below the last layer); 0 = half way up (where DoLa's bucket of "
                                 "early layers ends)",
                                 minimum=0, maximum=512, off_text="½ of the layers")
    dola_layers: str = setting("low", "DoLa layers", "dola amateur: the candidate premature layers, numbered as "
                               "output_hidden_states (0 = the embeddings, j = layer j's output): low = the even "
                               "layers of the lower half, high = the even layers of the upper half (the paper's "
                               "buckets; a model with tied embeddings starts at 2), or a list such as 2,6,10")
    dola_variant: str = setting("reference", "DoLa variant", "dola amateur: reference = the authors' code as "
                                "transformers 4.46 ran it (the LM head on the premature layer's un-normalised "
                                "output, no final norm, no soft-capping; its divergence ½[KL(M‖P) + KL(M‖Q)]; the "
                                "relative-top filter); formula = the paper's text (the logit lens: final norm + LM "
                                "head; the true Jensen-Shannon divergence ½[KL(P‖M) + KL(Q‖M)])",
                                choices=DOLA_VARIANTS)
    dola_repetition_penalty: float = setting(1.2, "DoLa repetition penalty", "dola amateur: the contrast scores of "
                                             "tokens already in the text are divided by this (multiplied when "
                                             "negative), as the paper recommends (1.2); 1 = off",
                                             minimum=1.0, widget_maximum=3.0, step=0.05)
    amateur_quant: str = setting("rtn-int4", "amateur quantization", "quantized amateur: the expert's copy with "
                                 "int4 weights (group 32), also an int4 LM head, or int8 per-channel weights",
                                 choices=QUICK_COPIES)
    amateur_model: str = setting("", "amateur model", "model amateur: a Hugging Face folder, .gguf file or cached "
                                 "model id that shares the expert's tokenizer (a smaller model of the same family)")
    contrast_sample: bool = setting(False, "sample", "draw the token from the normalised contrast scores (softmax over "
                              "the plausible set, after the sampling settings: temperature, top-k, top-p, min-p) "
                              "with the run's seed; off: the token with the highest contrast score")
    contrast_baseline: int = setting(0, "greedy baseline", "after the run, decode this many tokens with plain greedy "
                                   "on the same prompt to measure what the contrast costs per token (0 = skip)",
                                   minimum=0, maximum=4096)

    def layer_for(self, layers: int) -> int:
        """The amateur layer (1-based) of a ``layers``-layer expert."""
        return self.amateur_layer or max(1, layers // 2)

    def summary(self) -> str:
        amateur = {"layer": f"layer {self.amateur_layer or '½ up'}", "quantized": self.amateur_quant,
                   "dola": f"DoLa {self.dola_layers} {self.dola_variant} θ={self.dola_repetition_penalty:g}",
                   "model": self.amateur_model or "?"}[self.amateur]
        temperature = f" T={self.amateur_temperature:g}" if self.amateur_temperature != 1.0 else ""
        mode = " · sampled" if self.contrast_sample else ""
        return f"amateur {amateur}{temperature} · α={self.alpha:g}{mode}"

    def cross_checks(self) -> list[tuple[bool, str]]:
        return [(self.amateur != "model" or bool(self.amateur_model.strip()),
                 "the model amateur needs --amateur-model PATH (a smaller model with the expert's tokenizer)"),
                (dola_layers_valid(self.dola_layers),
                 f"dola_layers must be low, high or layer numbers such as 2,6,10 (got {self.dola_layers!r})")]


def dola_layers_valid(text: str) -> bool:
    text = text.strip()
    if text in ("low", "high"):
        return True
    parts = [p.strip() for p in text.split(",")]
    return bool(parts) and all(p.isdigit() for p in parts)


register_strategy(Strategy(
    "contrastive", "contrastive decoding (Li et al. 2023): the expert's plausible tokens, ranked by log p_expert − "
    "log p_amateur (an early layer, a quantized copy or a smaller model; not contrastive search, which is "
    "'contrastive-search')", sections=("sampling", "penalties"), groups=(ContrastiveSettings,),
    step_events=(ContrastStep, TokenStep), runner="playground.engine.contrastive.decode:run_contrastive",
    takes_progress=True, order=90))
