"""The preset watermark-vs-plain on the default model does what its description says: the same prompt, seed and
sampler twice, and transformers' own WatermarkDetector (the preset's settings, as its WatermarkingConfig names
them) finds the watermark in the left pane's output and not in the right one's."""

from __future__ import annotations

import pytest
import torch
from transformers import WatermarkDetector, WatermarkingConfig

from playground.engine.strategies import run_strategy
from playground.events.panes import PaneToken
from playground.presets import load_preset


@pytest.mark.model
def test_the_watermarked_pane_is_detected_and_the_plain_one_is_not(default_lm):
    preset = load_preset("watermark-vs-plain")
    events = list(run_strategy(default_lm, preset.settings))
    panes = {pane: [e.token_id for e in events if isinstance(e, PaneToken) and e.pane == pane] for pane in (0, 1)}
    assert len(panes[0]) > 60 and len(panes[1]) > 60 and panes[0] != panes[1]
    model = default_lm.model
    detector = WatermarkDetector(model.config, "cpu", WatermarkingConfig(greenlist_ratio=0.25, bias=2.0,
                                                                         seeding_scheme="lefthash"))
    prompt = next(e for e in events if type(e).__name__ == "RunStarted").prompt_token_ids
    scores = {pane: detector(torch.tensor([list(prompt[-1:]) + ids]), z_threshold=4.0, return_dict=True)
              for pane, ids in panes.items()}
    assert bool(scores[0].prediction[0]) and float(scores[0].z_score[0]) > 4.0  # found (z 10.3 here)
    assert not bool(scores[1].prediction[0]) and float(scores[1].z_score[0]) < 2.0  # not found (z 1.3)
