"""Constraints (--json-schema, --regex, --grammar, --choices): every output keeps to its constraint over many seeds;
the mask at each step equals a brute-force check with a fresh llguidance matcher (each token appended and asked);
the recorded mass removed is the raw probability of the forbidden tokens, computed here from the model's logits;
end tokens come only where the grammar accepts; bad constraints are refused before the first event with the
library's message; a budget too short, and a step with no token left, end the run with their own reasons.

The model is tiny and random, on the default model's real tokenizer (SmolLM2's 49,152 tokens): the grammar's
tokens are the real ones."""

from __future__ import annotations

import json
import re
from pathlib import Path

import llguidance
import llguidance.hf
import pytest
import torch

from playground.config import ConfigError, RunSettings
from playground.config.samplers.grammar import GrammarSettings, check_constraint, split_choices
from playground.engine.sampling import run_sampling
from playground.events import RunFinished, TokenStep, dumps_event, event_from_dict
from playground.models.loaded import LoadedModel

SMOLLM2 = Path.home() / ".cache" / "decoding-playground" / "models" / "SmolLM2-135M-Instruct"

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", "none"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    },
    "required": ["name", "age", "pet", "tags"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},  # a random model would otherwise pad with spaces for ever
}
REGEX = r"(cat|dog)s? [0-9]{1,3}(\.[0-9])?"


@pytest.fixture(scope="module")
def smol_tokenizer():
    if not (SMOLLM2 / "tokenizer.json").is_file():
        pytest.skip("the default model's tokenizer is not in the user cache (playground fetch-model)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SMOLLM2)


def _tiny_on(tokenizer, seed: int = 0, eos_bias: float = 0.0) -> LoadedModel:
    """A one-layer random llama as wide as the tokenizer's vocabulary, sharpened as tests/support's tiny models."""
    import transformers as tf

    config = tf.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                            tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        head = model.get_output_embeddings()
        head.weight.mul_(15.0)
        if eos_bias:
            head.weight[tokenizer.eos_token_id] += eos_bias * head.weight.std()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return LoadedModel(model=model, tokenizer=tokenizer, name=f"tiny-smol-{seed}", path="<memory>",
                       device=torch.device("cpu"), dtype=torch.float32)


@pytest.fixture(scope="module")
def smol_lm(smol_tokenizer):
    return _tiny_on(smol_tokenizer)


@pytest.fixture(scope="module")
def ll_tok(smol_tokenizer):
    return llguidance.hf.from_tokenizer(smol_tokenizer, n_vocab=len(smol_tokenizer))


def _settings(group: GrammarSettings, **flat) -> RunSettings:
    base = dict(prompt="Answer:", chat=False, strategy="sample", max_new_tokens=80, seed=0)
    return RunSettings.from_flat(**{**base, **flat}).with_group(group).validate()


def _run(lm, settings):
    events = list(run_sampling(lm, settings))
    steps = [e for e in events if isinstance(e, TokenStep)]
    done = events[-1]
    assert isinstance(done, RunFinished)
    return steps, done


def _check_person(value) -> None:
    """PERSON, checked by hand (no JSON-schema validator is installed here)."""
    assert isinstance(value, dict) and set(value) == {"name", "age", "pet", "tags"}, value
    assert isinstance(value["name"], str) and len(value["name"]) <= 6
    assert isinstance(value["age"], int) and not isinstance(value["age"], bool) and 0 <= value["age"] <= 120
    assert value["pet"] in ("cat", "dog", "none")
    assert isinstance(value["tags"], list) and len(value["tags"]) <= 2
    assert all(isinstance(t, str) and len(t) <= 4 for t in value["tags"])


def _fresh(ll_tok, group: GrammarSettings, prefix: list[int]):
    """A fresh library matcher for the constraint, fed ``prefix``."""
    matcher = llguidance.LLMatcher(ll_tok, check_constraint(group), log_level=0)
    assert matcher.consume_tokens(prefix), matcher.get_error()
    return matcher


def _reference_allowed(matcher, ll_tok, candidates, eos: int) -> list[int]:
    """The tokens of ``candidates`` the library's matcher takes in its state, each asked on its own
    (``validate_tokens``), with llguidance's two documented rules applied here: where the grammar forces bytes it
    allows only the first token of their canonical tokenization (its fast-forward tokens), not a shorter piece of
    them; the end token is allowed exactly where the grammar accepts."""
    forced, ff = matcher.compute_ff_bytes(), matcher.compute_ff_tokens()
    out = []
    for t in candidates:
        if t == eos:
            ok = matcher.is_accepting()
        else:
            piece = ll_tok.decode_bytes([t])
            ok = matcher.validate_tokens([t]) == 1 and not (
                ff and t != ff[0] and len(piece) < len(forced) and forced.startswith(piece))
        if ok:
            out.append(t)
    return out


# -- every output keeps to its constraint ----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(10))
def test_every_sampled_output_validates_against_its_schema(smol_lm, seed):
    steps, done = _run(smol_lm, _settings(GrammarSettings(json_schema=json.dumps(PERSON)), seed=seed,
                                          temperature=1.3, max_new_tokens=120))
    assert done.stop_reason == "grammar", (done.stop_reason, done.text)
    _check_person(json.loads(done.text))
    assert all(s.grammar is not None and s.grammar.allowed >= 1 for s in steps)


@pytest.mark.parametrize("seed", range(10))
def test_every_sampled_output_full_matches_its_regex(smol_lm, seed):
    _, done = _run(smol_lm, _settings(GrammarSettings(regex=REGEX), seed=seed, temperature=1.5))
    assert done.stop_reason in ("grammar", "eos"), done.stop_reason
    assert re.fullmatch(REGEX, done.text), done.text


def test_greedy_keeps_to_a_gbnf_grammar_and_to_the_choices(smol_lm, tmp_path):
    path = tmp_path / "answer.gbnf"
    path.write_text('root ::= "The answer is " ("yes" | "no") "."\n')
    _, done = _run(smol_lm, _settings(GrammarSettings(grammar=str(path)), strategy="greedy"))
    assert done.stop_reason == "grammar" and re.fullmatch(r"The answer is (yes|no)\.", done.text), done.text
    group = GrammarSettings(choices=(" Paris, London", " New York\\, NY"))
    assert split_choices(group.choices) == (" Paris", " London", " New York, NY")
    for seed in range(4):
        _, done = _run(smol_lm, _settings(group, seed=seed))
        assert done.stop_reason == "grammar" and done.text in (" Paris", " London", " New York, NY")


# -- the mask and its record against independent references ----------------------------------------------------------

def _raw_probs(lm, prompt_ids: list[int], generated: list[int]) -> torch.Tensor:
    """The model's raw next-token distribution after prompt + generated, from a fresh pass here."""
    ids = torch.tensor([prompt_ids + generated])
    with torch.no_grad():
        return lm.model(input_ids=ids).logits[0, -1].float().softmax(dim=-1)


def test_allowed_set_mass_removed_and_forced_top_equal_a_brute_force_check(smol_lm, ll_tok):
    group = GrammarSettings(json_schema=json.dumps(PERSON))
    events = list(run_sampling(smol_lm, _settings(group, seed=3, temperature=1.3, max_new_tokens=120)))
    prompt_ids = list(events[0].prompt_token_ids)
    steps = [e for e in events if isinstance(e, TokenStep)]
    taken = [s.token_id for s in steps]
    vocab = len(smol_lm.tokenizer)
    every = list(range(vocab))
    # every step: the count over the whole vocabulary, each token asked of a fresh matcher fed the prefix; the mass
    # removed from the model's own raw distribution; whether the raw top token was forbidden
    checked = 0
    for k, step in enumerate(steps):
        if k % 4 and k != len(steps) - 1:  # every fourth step and the last: the whole vocabulary each time
            continue
        matcher = _fresh(ll_tok, group, taken[:k])
        allowed = _reference_allowed(matcher, ll_tok, every, smol_lm.tokenizer.eos_token_id)
        probs = _raw_probs(smol_lm, prompt_ids, taken[:k]).double()
        forbidden = torch.ones(vocab, dtype=torch.bool)
        forbidden[allowed] = False
        assert step.grammar.allowed == len(allowed), k
        assert step.grammar.removed_mass == pytest.approx(float(probs[forbidden].sum()), abs=1e-5), k
        assert step.grammar.top_forbidden == bool(forbidden[int(probs.argmax())]), k
        assert step.token_id in allowed and step.processed_entropy >= 0
        shown_cut = {c.token_id for c in step.candidates if c.cut_by == "grammar"}
        assert shown_cut == {c.token_id for c in step.candidates if c.token_id not in set(allowed)}
        checked += 1
    assert checked >= 5 and any(s.grammar.removed_mass > 0.5 for s in steps)
    assert any(s.grammar.top_forbidden for s in steps) and any(s.grammar.allowed == 1 for s in steps)


def test_the_chain_sees_only_allowed_tokens_on_a_candidate_set(smol_lm, ll_tok):
    """The sampler's own mask, step by step, against a fresh matcher asked about 600 candidates (the first 400
    ids, the end token and random ones), with snapshot/restore and clone on the way."""
    from playground.engine.processors import SamplerRun, build_pipeline

    group = GrammarSettings(regex=REGEX)
    settings = _settings(group, strategy="greedy")
    run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=False)
    vocab = len(smol_lm.tokenizer)
    (grammar,) = build_pipeline(settings, sampling=False, tokenizer=smol_lm.tokenizer, vocab_size=vocab, run=run,
                                eos_ids=smol_lm.eos_token_ids)
    candidates = sorted({*range(400), *smol_lm.tokenizer.encode("cats 12.5 dog 7", add_special_tokens=False),
                         smol_lm.tokenizer.eos_token_id,
                         *torch.randint(0, vocab, (200,), generator=torch.Generator().manual_seed(1)).tolist()})
    text = smol_lm.tokenizer.encode("dogs 42.5", add_special_tokens=False)
    logits = torch.zeros(1, vocab)
    ids = torch.zeros(1, 1, dtype=torch.long)
    saved = None
    for k in range(len(text) + 1):
        out = grammar.apply(ids, logits)
        fresh = _fresh(ll_tok, group, text[:k])
        expected = _reference_allowed(fresh, ll_tok, candidates, smol_lm.tokenizer.eos_token_id)
        got = [t for t in candidates if torch.isfinite(out[0, t])]
        assert got == expected, k
        eos_ok = bool(torch.isfinite(out[0, smol_lm.tokenizer.eos_token_id]))
        assert eos_ok == fresh.is_accepting(), k  # the end token exactly where the grammar accepts
        if k == 1:
            saved, twin, before = grammar.snapshot(), grammar.clone(), out
        if k < len(text):
            run.accept(text[k], 1.0)
    assert grammar.finished() == ("grammar", "the regex is complete: nothing more can follow") or \
        grammar.incomplete() == ""
    grammar.restore(saved)
    assert torch.equal(torch.isfinite(grammar.apply(ids, logits)), torch.isfinite(before))
    assert torch.equal(torch.isfinite(twin.apply(ids, logits)), torch.isfinite(before))
    grammar.reset()
    assert [t for t in candidates if torch.isfinite(grammar.apply(ids, logits)[0, t])] == \
        _reference_allowed(_fresh(ll_tok, group, []), ll_tok, candidates, smol_lm.tokenizer.eos_token_id)


def test_end_tokens_only_where_the_grammar_accepts(smol_tokenizer, ll_tok):
    """A model that wants to end at every step (its end token's logit raised) still ends only on an accepting
    prefix: the output full-matches, and each earlier step forbade the end token."""
    eager = _tiny_on(smol_tokenizer, seed=1, eos_bias=6.0)
    eos = smol_tokenizer.eos_token_id
    for seed in range(4):
        group = GrammarSettings(regex=r"[a-z]{2,8}( [a-z]{2,8}){0,2}")
        steps, done = _run(eager, _settings(group, seed=seed, temperature=1.0))
        assert re.fullmatch(group.regex, done.text), done.text
        taken = [s.token_id for s in steps]
        for k, step in enumerate(steps):
            accepting = _fresh(ll_tok, group, taken[:k]).is_accepting()
            assert (step.token_id == eos) <= accepting, k
            shown = {c.token_id: c.cut_by for c in step.candidates}
            if eos in shown and not accepting:
                assert shown[eos] == "grammar", k
        assert done.stop_reason in ("eos", "grammar")
        assert any(s.grammar.top_forbidden for s in steps)  # the model's end was refused at least once


# -- bad input -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("group", "words"), [
    (GrammarSettings(json_schema='{"type": "objekt"}'), ["--json-schema", "objekt"]),
    (GrammarSettings(json_schema='{"type": '), ["--json-schema: not JSON", "line 1"]),
    (GrammarSettings(json_schema='[1, 2]'), ["a schema is a JSON object"]),
    (GrammarSettings(regex="[a-z"), ["--regex", "unclosed character class"]),
    (GrammarSettings(grammar="start: item\n"), ["--grammar", 'unknown name: "item"']),
    (GrammarSettings(grammar='root ::= "a" b\n'), ["--grammar (GBNF)", "'b' not found"]),
    (GrammarSettings(regex="a", choices=("x",)), ["give one constraint, not 2", "--regex", "--choices"]),
])
def test_a_bad_constraint_is_refused_before_the_first_event_with_the_librarys_message(smol_lm, group, words):
    settings = RunSettings.from_flat(prompt="Answer:", chat=False).with_group(group)
    with pytest.raises(ConfigError) as raised:
        settings.validate()
    assert all(w in str(raised.value) for w in words), str(raised.value)
    with pytest.raises(ConfigError):  # the runner checks the settings before it yields anything
        run_sampling(smol_lm, settings)


def test_a_missing_grammar_file_is_refused_and_a_file_is_read_into_the_settings(tmp_path):
    with pytest.raises(ConfigError, match=r"--grammar: no file .*missing\.gbnf"):
        GrammarSettings(grammar=str(tmp_path / "missing.gbnf")).validate()
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    group = GrammarSettings(json_schema=str(schema))
    assert json.loads(group.json_schema) == PERSON  # the settings hold the schema, not the path
    settings = RunSettings.from_flat(prompt="x").with_group(group)
    back, unknown = RunSettings.from_plain_dict(json.loads(json.dumps(settings.as_plain_dict())))
    assert unknown == [] and back.group(GrammarSettings) == group  # a saved run keeps the constraint


def test_the_command_line_refuses_a_bad_regex_with_the_librarys_message(capsys):
    from playground.cli import build_parser, main, settings_from_args

    args = build_parser().parse_args(["trace", "--prompt", "x", "--choices", "yes,no", "--choices", "maybe"])
    assert settings_from_args(args)[1].group(GrammarSettings).choices == ("yes,no", "maybe")
    assert main(["trace", "--prompt", "x", "--regex", "[a-z"]) == 2
    err = capsys.readouterr().err
    assert "--regex" in err and "unclosed character class" in err and "Traceback" not in err


def test_a_budget_that_ends_first_says_so(smol_lm):
    steps, done = _run(smol_lm, _settings(GrammarSettings(json_schema=json.dumps(PERSON)), max_new_tokens=3))
    assert len(steps) == 3 and done.stop_reason == "grammar_incomplete"
    assert "budget ended before the json schema was complete" in done.stop_note
    # an output the grammar already accepts keeps the budget's reason
    _, done = _run(smol_lm, _settings(GrammarSettings(regex="[a-z]+"), max_new_tokens=3, strategy="greedy"))
    assert done.stop_reason == "max_new_tokens" and done.stop_note == ""


def test_a_step_with_no_token_left_ends_the_run_with_a_message(smol_lm, ll_tok):
    group = GrammarSettings(choices=(" Paris",))
    first = _fresh(ll_tok, group, [])
    allowed = _reference_allowed(first, ll_tok, range(len(smol_lm.tokenizer)), smol_lm.tokenizer.eos_token_id)
    banned = tuple(f"{t}=-inf" for t in allowed)  # the logit bias (after the grammar) removes every allowed token
    steps, done = _run(smol_lm, _settings(group, logit_bias=banned))
    assert steps == [] and done.stop_reason == "grammar_blocked"
    assert f"allows {len(allowed)} here and the other samplers removed them all" in done.stop_note
    # a forced token the grammar forbids (a branch, or step mode's choice) ends the run after it, saying which
    forbidden = next(t for t in range(len(smol_lm.tokenizer)) if t not in allowed)
    steps, done = _run(smol_lm, _settings(group, forced_token_ids=(forbidden,)))
    assert [s.token_id for s in steps] == [forbidden] and done.stop_reason == "grammar_blocked"
    assert f"token {forbidden} is not one the choices allows" in done.stop_note


def test_a_strategy_without_the_runs_state_refuses_a_constraint(smol_lm):
    from playground.engine.strategies import run_strategy

    settings = RunSettings.from_flat(prompt="x", chat=False, strategy="kv-cache").with_group(
        GrammarSettings(regex="a+")).validate()
    with pytest.raises(ConfigError, match="grammar is not available with the kv-cache strategy"):
        list(run_strategy(smol_lm, settings))


# -- the record in saved runs ----------------------------------------------------------------------------------------

def test_the_steps_record_and_the_note_survive_a_saved_run(smol_lm):
    steps, done = _run(smol_lm, _settings(GrammarSettings(json_schema=json.dumps(PERSON)), max_new_tokens=4))
    for event in (*steps, done):
        assert event_from_dict(json.loads(dumps_event(event))) == event
    old = json.loads(dumps_event(steps[0]))
    del old["grammar"]
    assert event_from_dict(old).grammar is None  # a run saved before constraints
    old_done = json.loads(dumps_event(done))
    del old_done["stop_note"]
    assert event_from_dict(old_done).stop_note == ""


# -- the default model -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_default_model_writes_valid_json_and_matching_text_under_its_constraints(default_lm):
    """Constrained greedy and sampling on the real model: the schema's JSON validates, the regex full-matches."""
    prompts = ("Give me a person as JSON.", "Describe your favourite pet in JSON.")
    for prompt in prompts:
        for strategy, seed in (("greedy", 0), ("sample", 1)):
            settings = RunSettings.from_flat(prompt=prompt, strategy=strategy, seed=seed, max_new_tokens=80,
                                             temperature=0.8).with_group(
                GrammarSettings(json_schema=json.dumps(PERSON))).validate()
            _, done = _run(default_lm, settings)
            assert done.stop_reason == "grammar", (prompt, strategy, done.text)
            _check_person(json.loads(done.text))
    date = r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    settings = RunSettings.from_flat(prompt="When did the first person walk on the moon? Answer with a date.",
                                     strategy="greedy", max_new_tokens=20).with_group(
        GrammarSettings(regex=date)).validate()
    _, done = _run(default_lm, settings)
    assert done.stop_reason == "grammar" and re.fullmatch(date, done.text), done.text
