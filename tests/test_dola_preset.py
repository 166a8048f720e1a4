"""The dola-vs-layer preset shows what its description says, on the default model, cut short (12 tokens): every
pane answers Canberra, DoLa's low-bucket pane leaves the fixed-layer amateur's text, and DoLa alone on that bucket
picks its premature layer from several of the bucket's layers (read from its own contrast events)."""

from __future__ import annotations

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events.contrastive import ContrastStep
from playground.events.panes import PaneFinished
from playground.presets import load_preset

TOKENS = 12


def test_dola_preset_answers_and_hops_between_layers(default_lm):
    preset = load_preset("dola-vs-layer")
    settings = preset.settings.replace(max_new_tokens=TOKENS)
    done = {e.pane: e for e in run_strategy(default_lm, settings) if isinstance(e, PaneFinished)}
    assert len(done) == 4
    assert all("Canberra" in pane.text for pane in done.values()), [p.text for p in done.values()]
    assert done[2].text != done[1].text  # DoLa (low bucket) vs layer 15
    alone = RunSettings.from_flat(prompt=settings.prompt, chat=True, strategy="contrastive", amateur="dola",
                                  max_new_tokens=TOKENS)
    layers = [e.premature_layer for e in run_strategy(default_lm, alone) if isinstance(e, ContrastStep)]
    assert set(layers) <= set(range(2, 15, 2)) and len(set(layers)) >= 3, layers
