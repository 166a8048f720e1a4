"""Activation patching: a cell of each map equals two forwards run here with a hook that writes the clean
activation into the corrupted run (on several families); the strategy's events and refusals."""

from __future__ import annotations

import pytest
import torch

from playground.config import ConfigError, RunSettings
from playground.config.patching import PatchingSettings
from playground.engine.attribution.patching import Patcher
from playground.engine.strategies import run_strategy
from playground.events import RunFinished
from playground.events.patching import PatchingRow, PatchingStarted

CLEAN, CORRUPTED = "the cat sat on the mat", "the mat sat on the cat"  # the same number of tokens


# Each family's decoder blocks and output projections, written here (not read from the anatomy seam)
PATHS = {"llama": ("model.layers", "self_attn.o_proj", "mlp.down_proj"),
         "gemma2": ("model.layers", "self_attn.o_proj", "mlp.down_proj"),
         "gemma3": ("model.layers", "self_attn.o_proj", "mlp.down_proj"),
         "qwen2": ("model.layers", "self_attn.o_proj", "mlp.down_proj"),
         "phi3": ("model.layers", "self_attn.o_proj", "mlp.down_proj"),
         "gpt2": ("transformer.h", "attn.c_proj", "mlp.c_proj"),
         "gpt_neox": ("gpt_neox.layers", "attention.dense", "mlp.dense_4h_to_h")}


def _hand_cell(lm, family, kind, layer, position, clean_ids, corrupted_ids):
    """Logits at the last position of the corrupted prompt with one activation of the clean one written in."""
    stack, attention, mlp = PATHS[family]
    block = lm.model.get_submodule(stack)[layer]
    kept = {}

    def run(ids, hook_module=None, hook=None, pre=None):
        handles = []
        if hook is not None:
            handles.append(hook_module.register_forward_hook(hook))
        if pre is not None:
            handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        try:
            with torch.no_grad():
                return lm.model(torch.tensor([ids])).logits[0, -1]
        finally:
            for h in handles:
                h.remove()

    if kind == "residual":
        def keep(_m, args, kwargs):
            kept["h"] = (args[0] if args else kwargs["hidden_states"])[0, position].clone()

        def write(_m, args, kwargs):
            h = (args[0] if args else kwargs["hidden_states"]).clone()
            h[0, position] = kept["h"]
            return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})
        run(clean_ids, pre=keep)
        return run(corrupted_ids, pre=write)
    module = block.get_submodule(attention if kind == "attention" else mlp)

    def keep_out(_m, _a, out):
        kept["h"] = out[0, position].clone()

    def write_out(_m, _a, out):
        out = out.clone()
        out[0, position] = kept["h"]
        return out
    run(clean_ids, module, keep_out)
    return run(corrupted_ids, module, write_out)


@pytest.mark.parametrize("family", list(PATHS))
def test_a_cell_equals_two_hand_forwards(family):
    from support.tiny_models import build_tiny_lm

    lm = build_tiny_lm(family=family, layers=3)
    clean_ids, corrupted_ids = lm.tokenizer(CLEAN)["input_ids"], lm.tokenizer(CORRUPTED)["input_ids"]
    patcher = Patcher(lm)
    clean, corrupted = patcher.record(clean_ids), patcher.record(corrupted_ids)
    position = 2  # where the prompts differ
    for kind in ("residual", "attention", "mlp"):
        rows = patcher.patched_row(kind, 1, clean, corrupted)  # [T, vocab]
        expected = _hand_cell(lm, family, kind, 1, position, clean_ids, corrupted_ids)
        assert (expected - corrupted.logits).abs().max() > 1e-5, kind  # the patch changes something
        torch.testing.assert_close(rows[position], expected.float(), atol=1e-4, rtol=1e-4)
        same = 0  # a position where both prompts hold the same token: patching it changes nothing
        torch.testing.assert_close(rows[same], corrupted.logits, atol=1e-4, rtol=1e-4)


def _settings(**patching):
    group = PatchingSettings(corrupted=CORRUPTED, **patching)
    return RunSettings(strategy="patching", prompt=CLEAN, chat=False, groups=(group,))


def test_the_strategy_streams_every_row(tiny_lm):
    events = list(run_strategy(tiny_lm, _settings(patch_maps="residual,mlp")))
    started = next(e for e in events if isinstance(e, PatchingStarted))
    rows = [e for e in events if isinstance(e, PatchingRow)]
    assert [(r.map, r.layer) for r in rows] == [(m, n) for m in ("residual", "mlp") for n in range(2)]
    assert started.differ == (2, 10) and started.answer_id != started.foil_id
    with torch.no_grad():  # the clean and corrupted differences, by two plain forwards
        logits = tiny_lm.model(torch.tensor([started.clean_ids, started.corrupted_ids])).logits[:, -1]
    diff = logits[:, started.answer_id] - logits[:, started.foil_id]
    assert (started.clean_diff, started.corrupted_diff) == pytest.approx(diff.tolist(), abs=1e-4)
    # positions where both prompts hold the same token recover nothing; the recovered share is its definition
    same = [p for p in range(len(started.clean_ids)) if p not in started.differ]
    assert max(abs(rows[0].recovered[p]) for p in same) < 1e-3
    assert max(abs(v) for v in rows[0].recovered) > 0.05
    # the cells left uncomputed (activations equal in both runs) equal a full row's computed ones
    patcher = Patcher(tiny_lm)
    clean, corrupted = patcher.record(started.clean_ids), patcher.record(started.corrupted_ids)
    for row in rows:
        full = patcher.patched_row(row.map, row.layer, clean, corrupted)
        share = (full[:, started.answer_id] - full[:, started.foil_id] - started.corrupted_diff) / (
            started.clean_diff - started.corrupted_diff)
        assert list(row.recovered) == pytest.approx(share.tolist(), abs=5e-4, rel=1e-4)  # float32, batched
    assert isinstance(events[-1], RunFinished) and set(events[-1].figures) == {"residual_s", "mlp_s"}


def test_refusals(tiny_lm):
    with pytest.raises(ConfigError, match="same number of tokens"):
        list(run_strategy(tiny_lm, RunSettings(strategy="patching", prompt=CLEAN, chat=False,
                                               groups=(PatchingSettings(corrupted="a dog"),))))
    with pytest.raises(ConfigError, match="needs a corrupted prompt"):
        list(run_strategy(tiny_lm, RunSettings(strategy="patching", prompt=CLEAN, chat=False)))
    with pytest.raises(ConfigError, match="is the clean one"):
        list(run_strategy(tiny_lm, RunSettings(strategy="patching", prompt=CLEAN, chat=False,
                                               groups=(PatchingSettings(corrupted=CLEAN),))))


def test_stop_ends_the_map_between_rows(tiny_lm):
    events = list(run_strategy(tiny_lm, _settings(patch_maps="residual"), lambda: True))  # polled after each row
    assert sum(isinstance(e, PatchingRow) for e in events) == 1
    assert events[-1].stop_reason == "stopped" and "residual" in events[-1].stop_note
