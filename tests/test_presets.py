"""Every shipped preset loads, names a registered view, and really shows what it claims on the default model."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from playground.config import BeamSettings, SpeculativeSettings
from playground.config.catalog import STRATEGIES
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, TokenStep
from playground.events.layers import LayerStep
from playground.presets import load_preset, preset_names
from playground.state import most_interesting_step

EXPECTED = {
    "greedy-loop", "repetition-penalty", "beam-length-penalty-0", "beam-length-penalty-1", "beam-length-penalty-2",
    "temperature-low", "temperature-high", "top-k-flat-vs-peaked", "top-p-flat-vs-peaked", "speculative-prompt-lookup",
    "logit-lens", "early-exit", "kv-cache-paged", "contrastive-early-layer", "quant-lab-int4", "compare-strategies",
    "cascade", "kv-long-context", "dola-vs-layer", "speculative-tree",
}


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


def test_every_preset_loads_and_names_a_view():
    from playground.ui.views import view_names

    assert set(preset_names()) == EXPECTED
    for name in preset_names():
        preset = load_preset(name)
        assert preset.view in view_names()
        assert preset.settings.strategy in STRATEGIES
        assert preset.title and len(preset.description) > 40


def test_unknown_preset_names_the_known_ones():
    from playground.config import ConfigError

    with pytest.raises(ConfigError, match=r"no preset named 'nope' \(known: ban-cliches, beam-diverse-groups, "):
        load_preset("nope")


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


@pytest.mark.model
def test_paged_samples_share_the_prompt_and_the_cache_pays(default_lm):
    from playground.events.kv import KVCompare, KVPhase, KVStep, KVSweep

    # The preset's 40 tokens cut to 16 (the suite's time): the claims are about the prompt's blocks and the cache.
    events = list(run_strategy(default_lm, load_preset("kv-cache-paged").settings.replace(max_new_tokens=16)))
    steps = [e for e in events if isinstance(e, KVStep)]
    prompt_blocks = len(events[0].prompt_token_ids) // 16  # full blocks of the prompt, shared by all four
    assert prompt_blocks >= 2 and len(steps) == 16
    last = steps[-1]
    assert len(last.blocks.tables) == 4 and len(last.blocks.shared) == prompt_blocks
    assert last.total_bytes < 0.8 * last.formula_bytes  # four sequences, one copy of the prompt
    (compare,) = [e for e in events if isinstance(e, KVCompare)]
    # How much faster the cache is, and the batch sweep's throughput, are timings: benchmarks/bench_kv.py
    # prints them side by side; here, that both were measured for every token and batch size.
    assert compare.identical and len(compare.uncached_ms) == len(compare.cached_ms) > 0
    phases = {e.phase: e for e in events if isinstance(e, KVPhase)}
    assert phases["prefill"].intensity > 10 * phases["decode"].intensity
    (sweep,) = [e for e in events if isinstance(e, KVSweep)]
    assert sweep.batch_sizes == (1, 4, 16) and all(t > 0 for t in sweep.tokens_per_s)


def run_settings(lm, settings) -> tuple[list[TokenStep], RunFinished]:
    events = list(run_strategy(lm, settings))
    return [e for e in events if isinstance(e, TokenStep)], events[-1]


def test_the_int4_lab_preset_shows_where_int4_parts_from_the_reference(default_lm):
    from playground.events.panes import PaneFinished
    from playground.events.quant import QuantReady, QuantStep, QuantSummary

    # The preset's 48 tokens cut to 20 (the suite's time): the outputs part at token 4 on the default model.
    events = list(run_strategy(default_lm, load_preset("quant-lab-int4").settings.replace(max_new_tokens=20)))
    (ready,) = [e for e in events if isinstance(e, QuantReady)]
    assert ready.weight_bytes < ready.reference_weight_bytes / 2.5  # packed int4 and its scales, really stored
    assert ready.perplexity["rtn-int4"] > 1.5 * ready.perplexity["reference"]
    reference, quantized = (e for e in events if isinstance(e, PaneFinished))
    (summary,) = [e for e in events if isinstance(e, QuantSummary)]
    # The claim: the outputs part, and the teacher-forced KL shows the int4 copy is less sure, token by token.
    assert reference.token_ids != quantized.token_ids and 0 <= summary.first_divergence < 20
    steps = [e for e in events if isinstance(e, QuantStep)]
    assert summary.kl_mean > 0.05 and any(not s.top1_agrees for s in steps)


def test_the_side_by_side_preset_ranks_beam_above_hot_sampling(default_lm):
    from playground.events.panes import PaneFinished

    settings = load_preset("compare-strategies").settings.replace(max_new_tokens=24)
    done = [e for e in run_strategy(default_lm, settings) if isinstance(e, PaneFinished)]
    greedy, hot, nucleus, beam = done
    per_token = [d.figures["mean_logprob"] for d in done]
    # Beam search finds likelier text than greedy; a temperature of 1.4 wanders into unlikely text.
    assert beam.figures["mean_logprob"] >= greedy.figures["mean_logprob"] > hot.figures["mean_logprob"]
    assert nucleus.figures["mean_logprob"] > hot.figures["mean_logprob"] and min(per_token) == per_token[1]


EXPECTED.update({"xtc-cliche", "dry-loop"})  # the samplers' presets (below)
EXPECTED.update({"ban-cliches"})  # phrase bans with backtracking (tests/test_bans_default.py)
EXPECTED.update({"contrastive-search-loop"})  # contrastive search (tests/test_contrastive_search.py)
EXPECTED.update({"beam-forced-words"})  # constrained beam search (tests/test_forced_beam_reference.py)
EXPECTED.update({"beam-diverse-groups"})  # diverse beam search (tests/test_beam_groups_reference.py)
EXPECTED.update({"steering-sweep-happy"})  # the steering sweep (tests/test_steering_sweep_preset.py)
CLICHE = "In the heart of"


def _finished(lm, settings) -> RunFinished:
    events = list(run_strategy(lm, settings))
    assert isinstance(events[-1], RunFinished)
    return events[-1]


@pytest.mark.model
def test_xtc_breaks_the_cliche_that_greedy_and_plain_sampling_write(default_lm):
    preset = load_preset("xtc-cliche").settings
    greedy = _finished(default_lm, preset.replace(strategy="greedy", max_new_tokens=5))
    assert greedy.text.startswith(CLICHE)
    plain = _finished(default_lm, preset.replace(xtc_probability=0.0, max_new_tokens=5))
    assert plain.text.startswith(CLICHE)  # the same seed without XTC
    for seed in range(3):
        steps = [e for e in run_strategy(default_lm, preset.replace(seed=seed, max_new_tokens=8))
                 if isinstance(e, TokenStep)]
        text = "".join(s.text for s in steps)
        assert CLICHE not in text, text
        # Where XTC cut, every candidate at least 10 % likely (processed before it) but one is gone, the raw top first.
        cut_steps = [s for s in steps if any(c.cut_by == "xtc" for c in s.candidates)]
        assert cut_steps and all(s.candidates[0].cut_by == "xtc" and s.token_id != s.candidates[0].token_id
                                 for s in cut_steps)


@pytest.mark.model
def test_dry_stops_the_list_loop_that_a_mild_repetition_penalty_does_not(default_lm):
    preset = load_preset("dry-loop").settings

    def repeated_lines(text: str) -> int:
        lines = [line.strip().split(". ", 1)[-1] for line in text.splitlines() if line.strip()]  # "8. x" -> "x"
        return max(Counter(lines).values())

    penalised = _finished(default_lm, preset.replace(dry_multiplier=0.0, repetition_penalty=1.05))
    assert repeated_lines(penalised.text) >= 3, penalised.text
    events = list(run_strategy(default_lm, preset.replace(max_new_tokens=50)))  # greedy repeats by token 30
    fixed = events[-1]
    assert isinstance(fixed, RunFinished) and repeated_lines(fixed.text) == 1, fixed.text
    assert len(fixed.text.splitlines()) >= 7  # still a list, not an early stop
    assert any(effect.name == "dry" and effect.reweighted for e in events if isinstance(e, TokenStep)
               for effect in e.effects)


EXPECTED.update({"json-extraction"})  # a JSON schema overriding the model (tests/test_grammar_fast_forward.py)


def test_the_json_extraction_schema_forces_tokens_the_model_found_unlikely(default_lm):
    """Cut to the job's value (26 of its 33 tokens, the suite's time): the schema's keys and order override the
    model's top token, and at the job the model wants "Marine" (not in the enum) and gets "doctor" on a sliver."""
    import json

    from playground.config.samplers.grammar import GrammarSettings

    settings = load_preset("json-extraction").settings
    schema = json.loads(settings.group(GrammarSettings).json_schema)
    steps = [e for e in run_strategy(default_lm, settings.replace(max_new_tokens=26)) if isinstance(e, TokenStep)]
    text = "".join(s.text for s in steps)
    assert text.startswith('{"name": "Dr. Amelia Okafor", "age": 52, "job": "doctor"'), text
    assert "doctor" in schema["properties"]["job"]["enum"] and "Marine" not in text
    job = next(i for i, s in enumerate(steps) if "".join(t.text for t in steps[: i + 1]).endswith('"job": "d'))
    top = steps[job].candidates[0]
    assert top.text.strip() == "Marine" and top.raw_prob > 0.3 and steps[job].raw_prob < 0.001
    assert steps[job].grammar.top_forbidden and steps[job].grammar.removed_mass > 0.99
    overrode = [i for i, s in enumerate(steps) if s.grammar.top_forbidden]
    assert len(overrode) >= 6, overrode  # "name" over "facts", "job" over "country", the enum's letters, ...
    assert any(s.grammar.fast_forward for s in steps)
    # The step the view (and a screenshot) shows first: the job's, where the schema removed the most while the model
    # still had a choice (4 allowed: the enum's first letters).
    assert most_interesting_step(steps) == steps[job].step and steps[job].grammar.allowed > 1
