"""The salience and patching presets show what they say on the default model (cheap parts of them: the residual
map, occlusion)."""

from __future__ import annotations

import dataclasses

import pytest

from playground.config.patching import PatchingSettings
from playground.config.salience import SalienceSettings
from playground.engine.attribution.patching import Patcher
from playground.engine.strategies import run_strategy
from playground.events.patching import PatchingRow, PatchingStarted
from playground.events.salience import SalienceMap
from playground.presets import load_preset


def _with(settings, group_type, **values):
    groups = tuple(dataclasses.replace(g, **values) if isinstance(g, group_type) else g for g in settings.groups)
    return settings.replace(groups=groups)


def test_patching_capital_moves_france_to_the_last_position(default_lm):
    settings = _with(load_preset("patching-capital").settings, PatchingSettings, patch_maps="residual")
    events = run_strategy(default_lm, settings)
    started = next(e for e in events if isinstance(e, PatchingStarted))
    first = next(e for e in events if isinstance(e, PatchingRow))
    events.close()  # the rest of the map: three of its rows below, computed alone
    assert (started.answer_text, started.foil_text, started.differ) == (" Paris", " Rome", (3,))
    assert started.clean_diff > 5 > 0 > -5 > started.corrupted_diff  # 7.31 and -6.02 when recorded
    france, last = 3, len(started.clean_ids) - 1
    assert first.recovered[france] == pytest.approx(1.0, abs=0.02)
    patcher = Patcher(default_lm)
    clean, corrupted = patcher.record(started.clean_ids), patcher.record(started.corrupted_ids)
    shares = {}
    for layer in (18, 29):
        logits = patcher.patched_row("residual", layer, clean, corrupted, [france, last])
        diff = logits[:, started.answer_id] - logits[:, started.foil_id]
        shares[layer] = ((diff - started.corrupted_diff) / (started.clean_diff - started.corrupted_diff)).tolist()
    assert shares[18][0] > 0.9 and shares[18][1] < 0.1  # " France" still holds it at block 18 ...
    assert shares[29][0] < 0.05 and shares[29][1] > 0.95  # ... the last position at the end
    logits = patcher.patched_row("attention", 23, clean, corrupted, [last])  # the hand-off: one attention layer
    diff = float(logits[0, started.answer_id] - logits[0, started.foil_id])
    assert (diff - started.corrupted_diff) / (started.clean_diff - started.corrupted_diff) > 0.9  # 1.00 recorded


def test_salience_capital_occlusion_ranks_is_then_france(default_lm):
    settings = _with(load_preset("salience-capital").settings, SalienceSettings, salience="occlusion")
    maps = [e for e in run_strategy(default_lm, settings) if isinstance(e, SalienceMap)]
    assert len(maps) == 1 and maps[0].target_text == " Paris"
    order = sorted(range(len(maps[0].scores)), key=lambda i: -maps[0].scores[i])
    assert [maps[0].tokens[i] for i in order[:2]] == [" is", " France"]  # 25.5 and 8.9 nats when recorded
