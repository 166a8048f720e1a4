"""The dola-vs-layer preset shows what its description says, on the default model, cut short (12 tokens): the
fixed-layer amateur and DoLa's formula variant (high bucket) answer Canberra, the reference variant says Sydney over
both buckets, so the two variants side by side part; each pane ran the variant it names (read from its own
contrast events, run alone): the formula picks among the high bucket's layers, the reference over the low bucket
picks from several of that bucket's layers."""

from __future__ import annotations

import shlex

from playground.config import CompareSettings, RunSettings
from playground.engine.strategies import run_strategy
from playground.events.contrastive import ContrastiveStarted, ContrastStep
from playground.events.panes import PaneFinished
from playground.presets import load_preset

TOKENS = 12


def test_dola_preset_shows_both_variants_and_their_answers(default_lm):
    preset = load_preset("dola-vs-layer")
    settings = preset.settings.replace(max_new_tokens=TOKENS)
    done = {e.pane: e for e in run_strategy(default_lm, settings) if isinstance(e, PaneFinished)}
    assert len(done) == 4
    texts = [done[i].text for i in range(4)]
    assert "Canberra" in texts[0] and "Canberra" in texts[1], texts  # layer 15, DoLa high formula
    assert "Sydney" in texts[2] and "Sydney" in texts[3], texts  # DoLa high and low reference
    assert texts[1] != texts[2]  # the two variants, side by side on the same bucket
    assert "½[KL(M‖P) + KL(M‖Q)]" in preset.description and "without the final norm" in preset.description


def test_each_dola_pane_runs_the_variant_it_names(default_lm):
    preset = load_preset("dola-vs-layer")
    panes = preset.settings.group(CompareSettings).panes
    wanted = {1: ("high", "formula", set(range(15, 30, 2)), 2), 2: ("high", "reference", set(range(15, 30, 2)), 1),
              3: ("low", "reference", set(range(2, 15, 2)), 3)}
    for index, (bucket, variant, bucket_layers, distinct) in wanted.items():
        words = shlex.split(panes[index])
        assert words[words.index("--dola-layers") + 1] == bucket and words[words.index("--dola-variant") + 1] == variant
        alone = RunSettings.from_flat(prompt=preset.settings.prompt, chat=True, strategy="contrastive",
                                      amateur="dola", dola_layers=bucket, dola_variant=variant,
                                      max_new_tokens=TOKENS)
        events = list(run_strategy(default_lm, alone))
        assert next(e for e in events if isinstance(e, ContrastiveStarted)).dola_variant == variant
        layers = [e.premature_layer for e in events if isinstance(e, ContrastStep)]
        assert set(layers) <= bucket_layers and len(set(layers)) >= distinct, (variant, bucket, layers)
