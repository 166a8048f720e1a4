"""Layer-wise decoding settings: the logit lens (any token strategy), early exit, and layer skipping."""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.catalog import SharedGroup, Strategy, register_shared_group, register_strategy
from playground.config.groups import SettingsGroup, register_group
from playground.config.table import setting
from playground.events import TokenStep
from playground.events.layers import LayerStep

EXIT_METRICS = ("entropy", "max-prob", "saturation")
LENS_PRECISIONS = ("bfloat16", "model")
LENS_KINDS = ("logit", "tuned")


def parse_layer_set(text: str) -> tuple[int, ...]:
    """"3,10-12" → (3, 10, 11, 12): 1-based layer numbers, sorted, no repeats. ValueError with the reason."""
    layers: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{part!r} is not a layer number or a range such as 10-20")
        low, high = int(first), int(last) if dash else int(first)
        if low < 1 or high < low:
            raise ValueError(f"{part!r}: layers are numbered from 1, and a range goes upwards")
        layers.update(range(low, high + 1))
    return tuple(sorted(layers))


@register_group
@dataclass(frozen=True)
class LensSettings(SettingsGroup):
    name = "lens"
    title = "Logit lens"
    order = 60

    def active(self) -> bool:
        return self.lens

    lens: bool = setting(False, "logit lens", "record, for every generated token, each layer's next-token "
                         "distribution (the final norm and LM head applied to that layer's output): entropy, top "
                         "candidates, agreement with the last layer (early-exit and layer-skip runs without it record "
                         "only the layers they check anyway, so their speed is measured without the lens)")
    lens_top: int = setting(5, "lens candidates", "top candidates recorded per layer and token", minimum=1,
                            maximum=20)
    lens_precision: str = setting("bfloat16", "lens precision", "bfloat16: the layers' lens through a bfloat16 copy "
                                  "of a float32 LM head (about 5x cheaper on CPU, entropies within ~0.01 bits); "
                                  "model: the model's own precision. The answering layer always uses the model's "
                                  "own logits", choices=LENS_PRECISIONS)
    lens_kind: str = setting("logit", "lens kind", "logit: the final norm and LM head on each layer's output as it "
                             "is; tuned: on its output translated by that layer's trained affine map (the tuned lens, "
                             "Belrose et al. 2023; train it once per model: `playground tune-lens`). Each layer's KL "
                             "to the final distribution is recorded under both lenses once a tuned lens is trained",
                             choices=LENS_KINDS)

    def summary(self) -> str:
        kind = " (tuned)" if self.lens_kind == "tuned" else ""
        return f"lens{kind}, top {self.lens_top}" if self.lens else "no lens"


@register_group
@dataclass(frozen=True)
class LayerSettings(SettingsGroup):
    name = "layers"
    title = "Early exit and layer skipping"
    order = 70

    exit_metric: str = setting("entropy", "exit metric", "early exit: entropy = exit at the first layer whose "
                               "lens distribution has at most the threshold's bits; max-prob = whose top token has at "
                               "least the threshold's probability (both cost an LM-head product per check); "
                               "saturation = whose output has at least the threshold's cosine similarity with its "
                               "input (free)", choices=EXIT_METRICS)
    exit_threshold: float = setting(1.0, "exit threshold", "early exit: bits of entropy (at most), top-token "
                                    "probability or cosine similarity (at least) that make a layer answer",
                                    minimum=0.0, maximum=64.0, step=0.05)
    min_exit_layer: int = setting(0, "min exit layer", "early exit: the first layer allowed to answer (1-based; "
                                  "layers before it always run); 0 = two thirds of the way up (the lens of early "
                                  "layers is confidently wrong on most models)", minimum=0, maximum=512,
                                  off_text="⅔ of the layers")
    skip_layers: str = setting("", "skip layers", "layer skip: layers never run, 1-based, e.g. 10-20,25 (their keys "
                               "and values are filled from their input)")
    skip_threshold: float = setting(0.1, "skip threshold", "layer skip: also skip a layer when the layer before it "
                                    "changed the residual stream by less than this fraction of its norm "
                                    "(‖Δh‖ / ‖h‖; 0 = off); never two in a row", minimum=0.0, maximum=1.0,
                                    step=0.01, decimals=3, off_text="off")
    compare_full: bool = setting(True, "compare with full model", "early exit / layer skip: after the run, decode "
                                 "the same prompt with every layer to report agreement and the time saved")

    def summary(self) -> str:
        parts = []
        sign = "≤" if self.exit_metric == "entropy" else "≥"
        start = self.min_exit_layer or "⅔ up"
        parts.append(f"exit at {self.exit_metric} {sign} {self.exit_threshold:g} from layer {start}")
        if self.skip_layers or self.skip_threshold:
            parts.append(f"skip {self.skip_layers or '—'} / Δ<{self.skip_threshold:g}")
        return " · ".join(parts)

    def cross_checks(self) -> list[tuple[bool, str]]:
        try:
            parse_layer_set(self.skip_layers)
            layers_ok, why = True, ""
        except ValueError as error:
            layers_ok, why = False, str(error)
        return [
            (self.exit_metric == "entropy" or self.exit_threshold <= 1.0,
             f"exit_threshold is a {'probability' if self.exit_metric == 'max-prob' else 'cosine similarity'} with "
             f"--exit-metric {self.exit_metric}: between 0 and 1 (got {self.exit_threshold:g})"),
            (layers_ok, f"skip_layers: {why}"),
        ]

    def exit_from(self, layers: int) -> int:
        """The first layer allowed to answer in a ``layers``-layer model (1-based)."""
        return self.min_exit_layer or max(1, -(-2 * layers // 3))

    def skip_set(self) -> tuple[int, ...]:
        return parse_layer_set(self.skip_layers)


register_strategy(Strategy(
    "early-exit", "each token leaves the layer stack at the first layer whose logit lens is confident enough",
    sections=("penalties",), groups=(LayerSettings,), step_events=(LayerStep, TokenStep),
    runner="playground.engine.layers.decode:run_early_exit", records_itself=("lens",), order=50))
register_strategy(Strategy(
    "layer-skip", "each token passes some layers by: a fixed set, or after a layer that barely changed it",
    sections=("penalties",), groups=(LayerSettings,), step_events=(LayerStep, TokenStep),
    runner="playground.engine.layers.decode:run_layer_skip", records_itself=("lens",), order=60))
# The lens applies across strategies: each of these records it itself.
register_shared_group(SharedGroup(
    LensSettings, "--lens records each generated token's layers", "does not record them",
    takers=("greedy", "sample", "beam", "speculative", "early-exit", "layer-skip"), order=10))
