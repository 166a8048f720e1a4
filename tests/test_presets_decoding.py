"""The decoding presets (greedy, the samplers, beam search, speculative decoding, the lens, early exit) really show
what they claim on the default model. (Split from tests/test_presets.py, which keeps the list of presets and the
labs' presets: a file runs on one worker, and the two halves balance the suite's workers.)"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from playground.config import BeamSettings, SpeculativeSettings
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, TokenStep
from playground.events.layers import LayerStep
from playground.presets import load_preset


def ngram_counts(ids: tuple[int, ...], n: int = 4) -> Counter:
    return Counter(tuple(ids[i : i + n]) for i in range(len(ids) - n + 1))


def repeated_fraction(ids: tuple[int, ...], n: int = 4) -> float:
    """Share of n-gram positions whose n-gram already occurred earlier in the output."""
    seen, repeats = set(), 0
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    for gram in grams:
        repeats += gram in seen
        seen.add(gram)
    return repeats / len(grams)


def run(lm, name: str) -> tuple[list[TokenStep], RunFinished]:
    events = list(run_strategy(lm, load_preset(name).settings))
    assert isinstance(events[-1], RunFinished)
    return [e for e in events if isinstance(e, TokenStep)], events[-1]


def run_settings(lm, settings) -> tuple[list[TokenStep], RunFinished]:
    events = list(run_strategy(lm, settings))
    return [e for e in events if isinstance(e, TokenStep)], events[-1]


@pytest.mark.model
def test_greedy_loops_and_the_repetition_penalty_breaks_it(default_lm):
    _, loop = run(default_lm, "greedy-loop")
    assert max(ngram_counts(loop.token_ids).values()) >= 6
    assert repeated_fraction(loop.token_ids) >= 0.4
    assert loop.text.count("* Aniseed") >= 5

    steps, fixed = run(default_lm, "repetition-penalty")
    assert max(ngram_counts(fixed.token_ids).values()) <= 2
    assert repeated_fraction(fixed.token_ids) <= 0.05
    lines = [line.strip() for line in fixed.text.splitlines() if line.strip()]
    assert len(lines) == len(set(lines)) >= 5
    assert any(effect.name == "repetition_penalty" and effect.reweighted for s in steps for effect in s.effects)


@pytest.mark.model
def test_beam_length_penalty_0_1_2_pick_longer_answers(default_lm):
    lengths, reasons = [], []
    for penalty in (0, 1, 2):
        preset = load_preset(f"beam-length-penalty-{penalty}")
        assert preset.settings.group(BeamSettings).length_penalty == penalty
        _, done = run(default_lm, preset.name)
        lengths.append(len(done.token_ids))
        reasons.append(done.stop_reason)
    assert lengths[0] <= 10 and 20 <= lengths[1] <= 36 and lengths[2] == 40
    assert reasons == ["eos", "eos", "max_new_tokens"]


@pytest.mark.model
def test_low_temperature_stays_near_greedy_and_high_temperature_wanders(default_lm):
    def figures(name: str) -> tuple[float, float, float]:
        steps, _ = run(default_lm, name)
        n = len(steps)
        return (sum(s.processed_entropy for s in steps) / n, sum(s.prob for s in steps) / n,
                sum(s.raw_rank == 1 for s in steps) / n)

    entropy, prob, top = figures("temperature-low")
    assert entropy < 1.0 and prob > 0.7 and top > 0.75
    entropy, prob, top = figures("temperature-high")
    assert entropy > 3.0 and prob < 0.35 and top < 0.5


@pytest.mark.model
def test_top_k_keeps_k_while_top_p_follows_the_shape(default_lm):
    def kept(step: TokenStep) -> int:
        return sum(c.processed_prob > 0 for c in step.candidates)

    steps, _ = run(default_lm, "top-k-flat-vs-peaked")
    assert len(steps) == 20 and all(kept(s) == 5 for s in steps)
    flat, peaked = max(steps, key=lambda s: s.entropy), min(steps, key=lambda s: s.entropy)
    assert flat.entropy - peaked.entropy >= 3

    steps, _ = run(default_lm, "top-p-flat-vs-peaked")
    flat, peaked = max(steps, key=lambda s: s.entropy), min(steps, key=lambda s: s.entropy)
    assert flat.entropy - peaked.entropy >= 3
    assert kept(peaked) <= 3 and kept(flat) >= 40


@pytest.mark.model
def test_prompt_lookup_accepts_most_drafts_on_a_copying_task_and_changes_nothing(default_lm):
    preset = load_preset("speculative-prompt-lookup")
    spec = preset.settings.group(SpeculativeSettings)
    # Without the plain baseline after the run (the suite's time): nothing here reads the speed-up.
    _, done = run_settings(default_lm, preset.settings.with_group(dataclasses.replace(spec, baseline_tokens=0)))
    _, greedy = run_settings(default_lm, preset.settings.replace(strategy="greedy"))
    assert done.token_ids == greedy.token_ids  # verification keeps the target's own greedy output
    assert done.figures["acceptance_rate"] > 0.6
    assert done.figures["target_calls"] < 0.5 * len(done.token_ids)  # fewer than one target pass per two tokens


@pytest.mark.model
def test_the_tree_preset_keeps_greedy_and_accepts_more_per_pass_than_the_chain(default_lm):
    """Prompt lookup 2 wide against the same drafter as a chain on the same prompt (run here): the same text, fewer
    target passes, and at least 20 % more accepted tokens per pass (the preset's description says 2.75 against
    2.16)."""
    preset = load_preset("speculative-tree")
    spec = preset.settings.group(SpeculativeSettings)
    # Without the plain baseline after each run (the suite's time): nothing here reads the speed-up.
    bare = preset.settings.with_group(dataclasses.replace(spec, baseline_tokens=0))
    _, tree = run_settings(default_lm, bare)
    _, greedy = run_settings(default_lm, preset.settings.replace(strategy="greedy"))
    _, chain = run_settings(default_lm, bare.with_group(dataclasses.replace(spec, tree_width=1, baseline_tokens=0)))
    assert tree.token_ids == greedy.token_ids == chain.token_ids
    assert tree.figures["target_calls"] < chain.figures["target_calls"]
    assert tree.figures["mean_accepted"] >= 1.2 * chain.figures["mean_accepted"]


@pytest.mark.model
def test_the_lens_shows_the_answer_appearing_only_in_the_top_layers(default_lm):
    events = list(run_strategy(default_lm, load_preset("logit-lens").settings))
    steps = {e.step: e for e in events if isinstance(e, LayerStep)}
    tokens = [e for e in events if isinstance(e, TokenStep)]
    assert "".join(t.text for t in tokens).startswith("The capital of France is Paris.")
    paris = next(t for t in tokens if t.text == " Paris")
    lens = steps[paris.step]
    assert lens.layer_top[-1][0].token_id == paris.token_id
    agree = [i + 1 for i, a in enumerate(lens.agrees_with_final) if a]
    assert min(agree) > 20  # no layer below 21 guesses it
    # Early layers are confident about something else: the lowest-entropy layer of the first ten guesses another token.
    sure = min(range(10), key=lambda i: lens.layer_entropy[i])
    assert not lens.agrees_with_final[sure]


@pytest.mark.model
def test_early_exit_preset_keeps_the_text_and_skips_layers(default_lm):
    preset = load_preset("early-exit")
    events = list(run_strategy(default_lm, preset.settings))
    exits = [e.exit_layer for e in events if isinstance(e, LayerStep)]
    done = events[-1]
    _, greedy = run_settings(default_lm, preset.settings.replace(strategy="greedy"))
    assert done.token_ids == greedy.token_ids  # independent of the run's own agreement figure
    assert done.figures["identical_fraction"] == 1.0
    assert sum(e is not None for e in exits) >= 10 and all(e is None or e >= 20 for e in exits)
    assert done.figures["compute_saved"] > 0.05
