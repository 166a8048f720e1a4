"""Every shipped preset loads, names a registered view, and really shows what it claims on the default model (the
decoding presets: tests/test_presets_decoding.py; the labs' and the samplers' here)."""

from __future__ import annotations

from collections import Counter

import pytest

from playground.config.catalog import STRATEGIES
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, TokenStep
from playground.presets import load_preset, preset_names
from playground.state import most_interesting_step

EXPECTED = {
    "greedy-loop", "repetition-penalty", "beam-length-penalty-0", "beam-length-penalty-1", "beam-length-penalty-2",
    "temperature-low", "temperature-high", "top-k-flat-vs-peaked", "top-p-flat-vs-peaked", "speculative-prompt-lookup",
    "logit-lens", "early-exit", "kv-cache-paged", "contrastive-early-layer", "quant-lab-int4", "compare-strategies",
    "cascade", "kv-long-context", "dola-vs-layer", "speculative-tree",
}


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
EXPECTED.update({"logit-lens-gemma", "early-exit-gemma", "quant-lab-int4-gemma",  # Gemma 3 270M's
                 "kv-sliding-gemma"})  # (tests/test_gemma.py)
EXPECTED.update({"steering-sweep-happy"})  # the steering sweep (tests/test_steering_sweep_preset.py)
EXPECTED.update({"why-paris"})  # logit attribution, commitment and uncertainty (tests/test_dla_preset.py)
EXPECTED.update({"salience-capital", "patching-capital"})  # salience and patching (tests/test_attribution_presets.py)
EXPECTED.update({"watermark-vs-plain"})  # the watermark lab (its engine: tests/test_watermark_live.py)
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
