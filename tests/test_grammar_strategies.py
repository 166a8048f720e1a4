"""Constraints on the strategies that pick tokens besides greedy and sample: beam search (one matcher per beam),
contrastive decoding (a forbidden token scores -inf), cascade (whichever model picks) and side-by-side panes.

References are computed here: each beam's allowed set from a fresh llguidance matcher fed that beam's tokens and
asked about every one of the tiny tokenizer's 320 tokens (``validate_tokens``); transformers' own beam search with
``prefix_allowed_tokens_fn`` answering from such fresh matchers; the contrast and the cascade written out from
plain forward passes. One decode per fixture, shared by the asserts."""

from __future__ import annotations

import json
import math
import re
from functools import cache

import llguidance
import llguidance.hf
import pytest
import torch

from playground.config import RunSettings
from playground.config.samplers.grammar import GrammarSettings
from playground.engine.strategies import run_strategy
from playground.events import BeamStep, RunFinished, TokenStep, dumps_event, event_from_dict
from playground.events.cascade import CHEAP, FULL, CascadeStep
from playground.events.contrastive import ContrastStep
from playground.events.panes import PaneFinished

PROMPT = "The weather in Paris"
WORDS = r"[a-z ]{2,12}"  # always 70+ tokens allowed: no beam ever runs out
SCHEMA = {"type": "object", "properties": {"a": {"enum": ["cat", "dog"]}, "n": {"type": "integer", "minimum": 0,
                                                                              "maximum": 99}},
          "required": ["a", "n"], "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}


def settings(group: GrammarSettings | None = None, **flat) -> RunSettings:
    s = RunSettings.from_flat(**{"strategy": "beam", "prompt": PROMPT, "chat": False, **flat})
    return (s.with_group(group) if group is not None else s).validate()


def run(lm, s: RunSettings) -> list:
    events = list(run_strategy(lm, s))
    assert isinstance(events[-1], RunFinished)
    return events


def of(events, kind) -> list:
    return [e for e in events if isinstance(e, kind)]


@pytest.fixture(scope="module")
def ll_tok(tiny_lm):
    """The library's tokenizer for the tiny model's, made here (not the engine's cached one)."""
    return llguidance.hf.from_tokenizer(tiny_lm.tokenizer, n_vocab=len(tiny_lm.tokenizer))


def grammar_of(kind: str, value) -> str:
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(value)
    if kind == "schema":
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(value))
    return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in value))


class Reference:
    """Brute force: the tokens a fresh matcher fed ``prefix`` takes, each of the 320 asked on its own, with
    llguidance's two documented rules (the end token exactly where the grammar accepts; where the grammar forces
    bytes, only the first token of their canonical tokenization, not a shorter piece of them)."""

    def __init__(self, ll_tok, grammar: str, vocab: int, eos: int) -> None:
        self.ll_tok, self.grammar, self.vocab, self.eos = ll_tok, grammar, vocab, eos
        self.allowed = cache(self._allowed)

    def _allowed(self, prefix: tuple[int, ...]) -> frozenset[int]:
        m = llguidance.LLMatcher(self.ll_tok, self.grammar, log_level=0)
        assert m.consume_tokens(list(prefix)), m.get_error()
        forced, ff = m.compute_ff_bytes(), m.compute_ff_tokens()
        out = set()
        for t in range(self.vocab):
            if t == self.eos:
                ok = m.is_accepting()
            else:
                piece = self.ll_tok.decode_bytes([t])
                ok = m.validate_tokens([t]) == 1 and not (
                    ff and t != ff[0] and len(piece) < len(forced) and forced.startswith(piece))
            if ok:
                out.add(t)
        return frozenset(out)


def reference_for(lm, ll_tok, kind, value) -> Reference:
    return Reference(ll_tok, grammar_of(kind, value), len(lm.tokenizer), lm.tokenizer.eos_token_id)


def raw_probs(lm, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(torch.tensor([ids]), use_cache=False).logits[0, -1].float().softmax(-1)


def beam_prefixes(steps: list[BeamStep]) -> list[list[tuple[int, ...]]]:
    """The tokens of each beam expanded at each step, from the survivors' parents (the first step: the prompt)."""
    rows: list[tuple[int, ...]] = [()]
    out = []
    for step in steps:
        out.append(rows)
        rows = [rows[p] + (t,) for p, t in zip(step.parents, step.token_ids, strict=True)]
    return out


# -- beam search -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def words_beam(tiny_lm_eos):
    s = settings(GrammarSettings(regex=WORDS), num_beams=4, max_new_tokens=14, num_return_sequences=3)
    return s, run(tiny_lm_eos, s)


def test_constrained_beam_equals_transformers_beam_asking_a_fresh_matcher_per_hypothesis(tiny_lm_eos, ll_tok,
                                                                                         words_beam):
    _, events = words_beam
    lm = tiny_lm_eos
    prompt = list(events[0].prompt_token_ids)
    ref = reference_for(lm, ll_tok, "regex", WORDS)

    def allowed(_batch: int, ids: torch.Tensor) -> list[int]:
        return sorted(ref.allowed(tuple(ids[len(prompt):].tolist())))

    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=14, num_beams=4,
                                num_return_sequences=3, do_sample=False, prefix_allowed_tokens_fn=allowed,
                                output_scores=True, return_dict_in_generate=True)
    done = events[-1]
    assert len(done.sequences) == 3
    for row, ours in enumerate(done.sequences):
        length = int((out.beam_indices[row] != -1).sum())
        assert list(ours.token_ids) == out.sequences[row, len(prompt):len(prompt) + length].tolist(), row
        assert ours.score == pytest.approx(float(out.sequences_scores[row]), abs=1e-5)


def test_each_beams_mask_equals_a_brute_force_check_and_every_beam_keeps_to_the_regex(tiny_lm_eos, ll_tok,
                                                                                       words_beam):
    _, events = words_beam
    lm = tiny_lm_eos
    prompt = list(events[0].prompt_token_ids)
    ref = reference_for(lm, ll_tok, "regex", WORDS)
    steps = of(events, BeamStep)
    checked = 0
    for step, rows in zip(steps, beam_prefixes(steps), strict=True):
        assert len(step.grammar) == len(rows)  # one record per expanded beam
        for r, prefix in enumerate(rows):
            allowed = ref.allowed(prefix)
            record = step.grammar[r]
            assert record.allowed == len(allowed), (step.step, r)
            probs = raw_probs(lm, prompt + list(prefix)).double()
            forbidden = torch.ones(len(probs), dtype=torch.bool)
            forbidden[sorted(allowed)] = False
            assert record.removed_mass == pytest.approx(float(probs[forbidden].sum()), abs=1e-5)
            assert record.top_forbidden == bool(forbidden[int(probs.argmax())])
            assert all(c.token_id in allowed for c in step.candidates if c.beam == r), (step.step, r)
            checked += 1
    assert checked >= 20 and any(r.top_forbidden for s in steps for r in s.grammar)
    done = events[-1]
    assert done.stop_reason == "eos" and len(done.sequences) == 3
    for seq in done.sequences:
        assert seq.token_ids[-1] == lm.tokenizer.eos_token_id and re.fullmatch(WORDS, seq.text), seq.text
    for event in (steps[1], done):  # the per-beam records survive a saved run
        assert event_from_dict(json.loads(dumps_event(event))) == event


def test_a_constraint_that_allows_what_the_model_wants_leaves_beam_search_as_it_is(tiny_lm_eos):
    """Any token but the two special ones the search never takes (the padding and the start token; the end token
    where the grammar accepts, which is everywhere): the same beams, scores and returned sequences."""
    plain = run(tiny_lm_eos, settings(num_beams=4, max_new_tokens=12, num_return_sequences=4))
    taken = {t for s in of(plain, BeamStep) for t in s.token_ids} | {
        t for q in plain[-1].sequences for t in q.token_ids}
    assert not taken & {0, 1}  # the precondition: the constraint allows every token the search keeps
    free = run(tiny_lm_eos, settings(GrammarSettings(grammar="start: <[3-319]>*"), num_beams=4, max_new_tokens=12,
                                     num_return_sequences=4))
    assert [(q.token_ids, q.score) for q in free[-1].sequences] == [(q.token_ids, q.score) for q in plain[-1].sequences]
    assert [(s.parents, s.token_ids, s.scores) for s in of(free, BeamStep)] == \
        [(s.parents, s.token_ids, s.scores) for s in of(plain, BeamStep)]
    assert all(r.allowed < len(tiny_lm_eos.tokenizer) for s in of(free, BeamStep) for r in s.grammar)  # it masked


def test_every_beam_validates_against_a_schema_and_beams_with_no_token_drop_out(tiny_lm, ll_tok):
    events = run(tiny_lm, settings(GrammarSettings(json_schema=json.dumps(SCHEMA)), num_beams=3, max_new_tokens=24,
                                   num_return_sequences=3))
    done = events[-1]
    assert done.stop_reason == "eos" and len(done.sequences) == 3
    for seq in done.sequences:
        value = json.loads(seq.text)
        assert set(value) == {"a", "n"} and value["a"] in ("cat", "dog") and 0 <= value["n"] <= 99, seq.text
    choices = ("yes", "no", "maybe")
    events = run(tiny_lm, settings(GrammarSettings(choices=choices), num_beams=5, max_new_tokens=6,
                                   num_return_sequences=3))
    steps = of(events, BeamStep)
    assert min(len(s.parents) for s in steps) < 5  # fewer continuations than beams: the rest dropped out
    assert all(math.isfinite(x) and x > -100 for s in steps for x in s.scores)
    assert tiny_lm.tokenizer.eos_token_id not in {t for s in steps for t in s.token_ids}  # no beam runs on past its end
    assert sorted(seq.text for seq in events[-1].sequences) == sorted(choices)
    assert all(math.isfinite(seq.score) for seq in events[-1].sequences)
    ref = reference_for(tiny_lm, ll_tok, "choices", choices)
    for step, rows in zip(steps, beam_prefixes(steps), strict=True):
        assert [r.allowed for r in step.grammar] == [len(ref.allowed(p)) for p in rows]
    paged = run(tiny_lm, settings(GrammarSettings(choices=choices), num_beams=5, max_new_tokens=6,
                                  num_return_sequences=3, paged=True))  # its block tables follow fewer beams too
    assert [q.token_ids for q in paged[-1].sequences] == [q.token_ids for q in events[-1].sequences]


def test_a_beam_budget_too_short_and_a_forbidden_branch_say_so(tiny_lm):
    done = run(tiny_lm, settings(GrammarSettings(json_schema=json.dumps(SCHEMA)), num_beams=2, max_new_tokens=3))[-1]
    assert done.stop_reason == "grammar_incomplete" and "budget ended before the json schema" in done.stop_note
    x = tiny_lm.tokenizer.encode("x", add_special_tokens=False)
    done = run(tiny_lm, settings(GrammarSettings(choices=("yes",)), num_beams=2, max_new_tokens=4,
                                 forced_token_ids=tuple(x)))[-1]
    assert done.stop_reason == "grammar_blocked" and done.sequences == ()
    assert f"token {x[0]} is not one the choices allows" in done.stop_note


# -- contrastive decoding ----------------------------------------------------------------------------------------------

def layer_logits(model, ids: list[int], layer: int) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
        return model.lm_head(model.model.norm(out.hidden_states[layer][0, -1])).float()


def test_contrastive_decoding_scores_forbidden_tokens_minus_infinity(tiny_lm, ll_tok):
    alpha = 0.1
    events = run(tiny_lm, settings(GrammarSettings(regex=WORDS), strategy="contrastive", amateur="layer",
                                   amateur_layer=1, alpha=alpha, amateur_temperature=1.0, max_new_tokens=10))
    prompt = list(events[0].prompt_token_ids)
    ref = reference_for(tiny_lm, ll_tok, "regex", WORDS)
    contrasts, tokens = of(events, ContrastStep), of(events, TokenStep)
    assert len(contrasts) == len(tokens) >= 2
    generated: list[int] = []
    for c, t in zip(contrasts, tokens, strict=True):
        allowed = ref.allowed(tuple(generated))
        ids = prompt + generated
        with torch.no_grad():
            expert = tiny_lm.model(torch.tensor([ids]), use_cache=False).logits[0, -1].float()
        keep = torch.zeros(len(expert), dtype=torch.bool)
        keep[sorted(allowed)] = True
        e = expert.masked_fill(~keep, -math.inf).log_softmax(-1)
        a = layer_logits(tiny_lm.model, ids, 1).log_softmax(-1)
        plausible = (e - e.max()).exp() >= alpha
        scores = torch.where(plausible, e - a, torch.tensor(-math.inf))
        assert t.token_id == int(scores.argmax()), c.step
        for cand in c.candidates:
            assert (cand.score == -math.inf) if cand.token_id not in allowed else \
                cand.score == pytest.approx(float(scores[cand.token_id]), abs=1e-4)
        assert t.grammar is not None and t.grammar.allowed == len(allowed)
        generated.append(t.token_id)
    done = events[-1]
    assert done.stop_reason in ("eos", "max_new_tokens", "grammar") and re.fullmatch(WORDS, done.text), done.text
    assert any(t.grammar.top_forbidden for t in tokens)  # the mask overrode the expert somewhere


def test_contrastives_greedy_baseline_keeps_to_the_constraint(tiny_lm):
    """The baseline is constrained greedy: where the contrastive run parts from it equals where it parts from a
    constrained greedy run made here."""
    group = GrammarSettings(regex=WORDS)
    done = run(tiny_lm, settings(group, strategy="contrastive", amateur="layer", amateur_layer=1,
                                 contrast_baseline=6))[-1]
    greedy = run(tiny_lm, settings(group, strategy="greedy"))[-1]
    ours, theirs = list(done.token_ids[:6]), list(greedy.token_ids[:6])
    pairs = zip(ours, theirs, strict=False)
    parted = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(ours), len(theirs)))
    assert re.fullmatch(WORDS, greedy.text) and done.figures["greedy_tokens_per_s"] > 0
    assert done.figures["first_divergence"] == parted
    # One choice fixes every token: the contrastive run and a constrained baseline agree throughout (-1: never part;
    # an unconstrained baseline parts at once).
    done = run(tiny_lm, settings(GrammarSettings(choices=("rain and sun",)), strategy="contrastive", amateur="layer",
                                 amateur_layer=1, contrast_baseline=6))[-1]
    assert done.text == "rain and sun" and done.figures["first_divergence"] == -1


# -- cascade ---------------------------------------------------------------------------------------------------------

def masked_top(logits: torch.Tensor, allowed: frozenset[int]) -> tuple[int, float]:
    keep = torch.zeros(len(logits), dtype=torch.bool)
    keep[sorted(allowed)] = True
    probs = logits.masked_fill(~keep, -math.inf).softmax(-1)
    token = int(probs.argmax())
    return token, float(probs[token])


@pytest.mark.parametrize("unit", ["token", "response"])
def test_cascade_masks_whichever_model_picks(tiny_lm, ll_tok, unit):
    """Per token: the cheap model (one layer) proposes under the mask, the full model decides under it when the
    cheap one is unsure. Per response (threshold 1: always thrown away): the full model's response starts from the
    prompt's constraint again, so it is the full model's constrained greedy."""
    threshold = 0.5 if unit == "token" else 1.0
    events = run(tiny_lm, settings(GrammarSettings(regex=WORDS), strategy="cascade", cheap="layers", cheap_layers=1,
                                   cascade_threshold=threshold, cascade_unit=unit, max_new_tokens=10,
                                   cascade_compare=unit == "response"))
    prompt = list(events[0].prompt_token_ids)
    ref = reference_for(tiny_lm, ll_tok, "regex", WORDS)
    out = [s for s in of(events, CascadeStep) if not s.draft]
    generated: list[int] = []
    for step in out:
        allowed = ref.allowed(tuple(generated))
        ids = prompt + generated
        cheap, p = masked_top(layer_logits(tiny_lm.model, ids, 1), allowed)
        full, _ = masked_top(raw_probs(tiny_lm, ids).log(), allowed)
        if unit == "token":
            assert step.cheap_token_id == cheap and step.cheap_prob == pytest.approx(p, abs=1e-5)
            assert step.producer == (FULL if p < threshold else CHEAP)
        assert step.token_id == (full if step.producer == FULL else cheap), step.step
        generated.append(step.token_id)
    done = events[-1]
    assert done.token_ids == tuple(generated) and re.fullmatch(WORDS, done.text), done.text
    drafted = [s.token_id for s in of(events, CascadeStep) if s.draft]
    if unit == "response":
        assert drafted and all(s.producer == FULL for s in out)
        assert re.fullmatch(WORDS, tiny_lm.tokenizer.decode(drafted, skip_special_tokens=True))
        assert done.figures["identical_fraction"] == 1.0  # the full model alone, constrained, agrees


# -- side by side ----------------------------------------------------------------------------------------------------

def test_side_by_side_panes_pass_the_constraint_to_each_pane(tiny_lm):
    from playground.config import CompareSettings

    s = RunSettings(strategy="compare", prompt=PROMPT, chat=False, max_new_tokens=8,
                    groups=(CompareSettings(panes=("greedy", "beam --num-beams 3", "sample --seed 3")),
                            GrammarSettings(regex=WORDS))).validate()
    events = run(tiny_lm, s)
    panes = of(events, PaneFinished)
    assert len(panes) == 3 and all(re.fullmatch(WORDS, p.text) for p in panes), [p.text for p in panes]
    assert all(t.grammar is not None for t in of(events, TokenStep))  # pane 0 (greedy) records its mask


# -- the window --------------------------------------------------------------------------------------------------------

def test_the_beam_tree_draws_a_constrained_run_and_no_view_fails(qtbot, tmp_path, tiny_lm_eos):
    from PySide6.QtCore import Qt
    from windows import let_go, open_window

    choices = ("yes", "no", "maybe")  # fewer continuations than beams at every step: beams drop out
    s = settings(GrammarSettings(choices=choices), num_beams=5, max_new_tokens=5, num_return_sequences=3)
    w = open_window(qtbot, tmp_path, tiny_lm_eos, s)
    try:
        w.set_run_settings(s)
        qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not w.busy and w.session.runs and w.session.runs[-1].finished is not None,
                        timeout=60_000)
        run_ = w.session.runs[-1]
        assert run_.error is None and run_.finished.text in choices
        panel = w.views["beam"].panel
        steps = [e for e in run_.events if isinstance(e, BeamStep)]
        assert panel.tree.steps == len(steps) >= 2 and w.docks["beam"].pages.currentWidget() is w.views["beam"]
        assert sum(len(chunk.nodes.data) for chunk in panel._chunks) == len(panel.tree.nodes)
        assert all(math.isfinite(n.cum_logprob) for n in panel.tree.nodes)  # no forbidden continuation drawn
        assert len(panel._best_path.getData()[0]) == len(panel.tree.best_path) >= 2
        for name, dock in w.docks.items():  # every other view says it has nothing for the run, none that it failed
            assert "failed" not in dock.empty.text() and "raised" not in dock.empty.text(), name
    finally:
        let_go(w)
