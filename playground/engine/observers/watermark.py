"""The watermark's live record: after each generated token, its colour and the running score as the detector
computes them (``playground.watermarking.detect``: the same green lists and g-values), the model's entropy
where it was drawn and the KL from the model's distribution to the watermarked one (both from the step's raw logits,
at temperature 1; a strategy that hands the loop no logits leaves them unknown)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from playground.config.samplers.watermark import WatermarkSettings, parse_keys
from playground.engine.observe import Observer, register_observer
from playground.events.watermark import WatermarkStarted, WatermarkStep
from playground.watermarking import GreenLists, SynthID, kirchenbauer_key, synthid_key
from playground.watermarking.detect import p_value, z_of

if TYPE_CHECKING:
    from playground.config import RunSettings
    from playground.engine.decode import DecodeLoop, Picked
    from playground.engine.run_context import RunContext
    from playground.models.loaded import LoadedModel

LN2 = math.log(2)


def entropy_and_kl(raw: torch.Tensor, marked: torch.Tensor) -> tuple[float, float]:
    """(entropy of softmax(raw) in bits, KL(softmax(marked) ‖ softmax(raw)) in nats) for [vocab] logits."""
    logp = raw.float().log_softmax(-1)
    logq = marked.float().log_softmax(-1)
    q = logq.exp()
    finite = q > 0
    kl = float((q[finite] * (logq[finite] - logp[finite])).sum())
    return float(torch.special.entr(logp.exp()).sum()) / LN2, max(kl, 0.0)


def entropy_and_green_kl(raw: torch.Tensor, green: torch.Tensor, bias: float) -> tuple[float, float]:
    """The same for green lists without a second softmax: with P the model's green mass and Z = 1 + (e^δ − 1)·P,
    the watermarked distribution is p·e^(δ·green)/Z, so KL = δ·e^δ·P/Z − ln Z."""
    p = raw.float().softmax(-1)
    green_mass = float(p[green.to(p.device)].sum()) if green.dtype == torch.bool else float((p * green).sum())
    z = 1.0 + math.expm1(bias) * green_mass
    kl = bias * math.exp(bias) * green_mass / z - math.log(z)
    return float(torch.special.entr(p).sum()) / LN2, max(kl, 0.0)


class WatermarkObserver(Observer):
    def __init__(self, g: WatermarkSettings, vocab_size: int) -> None:
        self.g = g
        self.lists = GreenLists.of(kirchenbauer_key(g, vocab_size)) if g.watermark == "kirchenbauer" else None
        self.synthid = SynthID(synthid_key(g)) if g.watermark == "synthid" else None
        self.gains: list[float | None] = []  # per generated token: what it adds to the score (None: not scored)
        self.total = 0.0
        self.count = 0

    def started(self, loop: DecodeLoop) -> list[Any]:
        g = self.g
        if self.synthid is not None:
            return [WatermarkStarted(scheme="synthid", summary=g.summary(), threshold=g.z_threshold,
                                     depth=len(parse_keys(g.keys)), skipped=g.ngram_len - 1)]
        return [WatermarkStarted(scheme="kirchenbauer", summary=g.summary(), threshold=g.z_threshold,
                                 greenlist_ratio=g.greenlist_ratio, skipped=0)]

    def step_events(self, loop: DecodeLoop, picked: Picked, units: int) -> Sequence[Sequence[Any]] | None:
        if picked.rows:
            return None
        out = []
        start = len(loop.prompt_ids)
        for j in range(units):
            index = picked.first + j
            ids = loop.ids.data[:, : start + index]  # the context the token was drawn after
            token = loop.generated[index]
            raw = picked.logits[j: j + 1].float() if picked.logits is not None and j < picked.logits.shape[0] \
                else None
            out.append([self._step(index, ids, token, raw, start)])
        return out

    def _step(self, index: int, ids: torch.Tensor, token: int, raw: torch.Tensor | None, start: int
              ) -> WatermarkStep:
        g_values: tuple[int, ...] = ()
        marked = None
        entropy_kl: tuple[float, float] | None = None
        if self.lists is not None:
            width = self.g.context_width
            scored = ids.shape[1] >= width
            window = ids[0, ids.shape[1] - width:].tolist() if scored else []
            colour = float(self.lists.is_green(window, token)) if scored else 0.0
            if raw is not None and scored:
                green = self.lists.apply(ids, raw)[1][0]
                if green is not None:
                    entropy_kl = entropy_and_green_kl(raw[0], green, self.g.bias)
            gained = colour
        else:
            assert self.synthid is not None
            wm = self.synthid
            probe = raw if raw is not None else torch.zeros(1, 1)  # (no logits: whether it acted, from the ids)
            out, scored = wm.apply(ids, probe, start)
            marked = out if raw is not None else None
            contexts = wm.generation_contexts(ids, start)
            values = wm.g_values_after(wm.context_hash(contexts[-1]), torch.tensor([token], device=ids.device))[0]
            g_values = tuple(int(v) for v in values.tolist())
            colour = gained = sum(g_values) / len(g_values)
        del self.gains[index:]  # a rollback (phrase bans) decodes this position again: the undone tokens leave
        self.gains.append(gained if scored else None)
        counted = [v for v in self.gains if v is not None]
        self.total, self.count = sum(counted), len(counted)
        z = self._z()
        if raw is not None and marked is not None:
            entropy_kl = entropy_and_kl(raw[0], marked[0])
        entropy, kl = entropy_kl if entropy_kl is not None else (None, None)
        return WatermarkStep(step=index, token_id=token, scored=scored, colour=colour, g_values=g_values,
                             z_score=z, p_value=p_value(z) if math.isfinite(z) else math.nan, count=self.count,
                             entropy=entropy, kl=kl)

    def _z(self) -> float:
        if not self.count:
            return math.nan
        if self.lists is not None:
            return z_of(self.total, self.count, self.g.greenlist_ratio)
        depth = len(parse_keys(self.g.keys))
        return (self.total / self.count - 0.5) / math.sqrt(1.0 / (4 * self.count * depth))


def _watermark(lm: LoadedModel, settings: RunSettings, context: RunContext) -> WatermarkObserver | None:
    g = settings.group(WatermarkSettings)
    if not g.active():
        return None
    return WatermarkObserver(g, lm.vocab_size)


register_observer("watermark", _watermark, order=60)
