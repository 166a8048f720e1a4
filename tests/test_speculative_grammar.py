"""Speculation under a constraint (issue 29, point 3), on one-layer random models as wide as the default model's
tokenizer (llguidance needs a real tokenizer): greedy speculative decoding with a regex or a JSON schema is the
plain constrained greedy decode token for token (a draft model's chains and trees, prompt lookup's chains); the
drafts the grammar rejected before verification, and each draft's span (forced, inside, outside a constrained
span), are what a fresh library matcher says of each drafted token here; sampled verification with a forbidden
draft still emits the constrained target's distribution; the speculative view draws the grammar's marks and the
split figures.

Each run is decoded once (module fixtures) and read by several tests.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from pathlib import Path

import llguidance
import pytest
import torch

from playground.config import RunSettings
from playground.config.samplers.grammar import GrammarSettings, check_constraint
from playground.engine.processors import build_pipeline
from playground.engine.samplers.grammar import Grammar
from playground.engine.speculative import decode as decode_module
from playground.engine.speculative.constrained import judge_draft
from playground.engine.speculative.drafters import SmallModelDrafter
from playground.engine.speculative.tree import chain
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, TokenStep
from playground.events.speculative import SpeculativeRound
from playground.models.loaded import LoadedModel

SMOLLM2 = Path.home() / ".cache" / "decoding-playground" / "models" / "SmolLM2-135M-Instruct"
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0},
                   "pet": {"enum": ["cat", "dog", "none"]}},
    "required": ["name", "age", "pet"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},  # a random model would otherwise pad with spaces for ever
}
REGEX = r"(cats|dogs) [0-9]{1,3}( (cats|dogs) [0-9]{1,3}){0,3}"
SCHEMA = GrammarSettings(json_schema=json.dumps(PERSON))
PATTERN = GrammarSettings(regex=REGEX)
LOOKUP_PROMPT = "cats 12 dogs 7 cats 12 dogs 7 cats 1"
SCHEMA_PROMPT = 'Person: {"name":"Ann","age":7,"pet":"cat"} Person:'


@pytest.fixture(scope="module")
def smol_tokenizer():
    if not (SMOLLM2 / "tokenizer.json").is_file():
        pytest.skip("the default model's tokenizer is not in the user cache (playground fetch-model)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SMOLLM2)


def tiny_on(tokenizer, model=None, seed: int = 0) -> LoadedModel:
    """A one-layer random llama as wide as the tokenizer (sharpened as tests/support's tiny models), or ``model``."""
    import transformers as tf

    if model is None:
        config = tf.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                tie_word_embeddings=False)
        torch.manual_seed(seed)
        model = tf.LlamaForCausalLM(config).eval()
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(15.0)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    return LoadedModel(model=model, tokenizer=tokenizer, name=f"tiny-smol-{seed}", path="<memory>",
                       device=torch.device("cpu"), dtype=torch.float32)


@pytest.fixture(scope="module")
def target(smol_tokenizer):
    return tiny_on(smol_tokenizer)


@pytest.fixture(scope="module")
def draft_model(target):
    """The target with noise on its weights: a drafter that agrees with it often, not always."""
    model = copy.deepcopy(target.model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * param.std() * 0.3)
    return model


@pytest.fixture(scope="module")
def ll_tok(smol_tokenizer, target):
    """The library's tokenizer (llguidance.hf builds it, ~2 s: the one the runs built is reused; the matchers asked
    here are fresh)."""
    from playground.engine.samplers.grammar import ll_tokenizer

    return ll_tokenizer(smol_tokenizer, target.model.config.vocab_size, tuple(target.eos_token_ids))


def settings(group: GrammarSettings, **flat) -> RunSettings:
    base = dict(chat=False, max_new_tokens=40, seed=0, baseline_tokens=0)
    return RunSettings.from_flat(**{**base, **flat}).with_group(group).validate()


def tokens_of(events: list) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenStep)]


def rounds_of(events: list) -> list[SpeculativeRound]:
    return [e for e in events if isinstance(e, SpeculativeRound)]


CASES = {  # name: (constraint, prompt, speculative options)
    "lookup-chain-regex": (PATTERN, LOOKUP_PROMPT, {"draft": "prompt-lookup", "draft_k": 4}),
    # one choice: every step but the first forced, copied by prompt lookup; the grammar completes inside a round
    "lookup-chain-choice": (GrammarSettings(choices=(" the cat sat on the mat",)), "x the cat sat on the mat. x",
                            {"draft": "prompt-lookup", "draft_k": 4}),
    "model-chain-schema": (SCHEMA, SCHEMA_PROMPT, {"draft": "model", "draft_k": 4}),
    "model-tree-schema": (SCHEMA, SCHEMA_PROMPT, {"draft": "model", "draft_k": 3, "tree_width": 2, "tree_nodes": 6}),
}


@pytest.fixture(scope="module")
def runs(target, draft_model):
    """Each case decoded once: the speculative run's events and plain constrained greedy's (the draft model is
    handed to the run in memory, as the "model" drafter would load it)."""
    patch = pytest.MonkeyPatch()
    made = decode_module.make_drafter

    def make_drafter(lm, spec, pipeline, generator, *context):
        if spec.draft != "model":
            return made(lm, spec, pipeline, generator, *context)
        return SmallModelDrafter(draft_model, pipeline, spec.do_sample, generator, lm.device)

    patch.setattr(decode_module, "make_drafter", make_drafter)
    out = {}
    try:
        references: dict[tuple, list] = {}
        for name, (group, prompt, options) in CASES.items():
            key = (group, prompt)
            if key not in references:
                references[key] = list(run_strategy(target, settings(group, prompt=prompt, strategy="greedy")))
            spec = list(run_strategy(target, settings(group, prompt=prompt, strategy="speculative",
                                                      draft_model="in-memory", **options)))
            out[name] = (references[key], spec)
        sampled = settings(SCHEMA, prompt=SCHEMA_PROMPT, strategy="speculative", draft_model="in-memory",
                           draft="model", draft_k=4, do_sample=True, temperature=1.0, seed=3)
        out["model-chain-schema-sampled"] = (None, list(run_strategy(target, sampled)))
    finally:
        patch.undo()
    return out


# -- 1. greedy under a grammar is constrained greedy -----------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_greedy_speculation_under_a_grammar_is_constrained_greedy(runs, case):
    reference, spec = runs[case]
    assert tokens_of(spec) == tokens_of(reference)
    assert spec[-1].stop_reason == reference[-1].stop_reason
    rounds = rounds_of(spec)
    drafted = [d for r in rounds for d in r.drafted]
    assert any(d.grammar_rejected for d in drafted) and any(d.accepted for d in drafted), \
        "precondition: drafts the grammar rejected and drafts the target accepted"
    if "tree" in case:
        assert any(r.is_tree and r.accepted for r in rounds)


def test_a_step_with_no_token_left_ends_a_speculative_run_as_a_plain_one(target):
    group = GrammarSettings(choices=(" Paris",))
    built = next(g for g in build_pipeline(settings(group, prompt="x", strategy="greedy"), sampling=False,
                                           tokenizer=target.tokenizer, vocab_size=len(target.tokenizer),
                                           carried=("grammar",)) if isinstance(g, Grammar))
    allowed = torch.nonzero(built.allowed().mask).flatten().tolist()
    banned = tuple(f"{t}=-inf" for t in allowed)  # the logit bias (after the grammar) removes every allowed token
    ends = []
    for strategy, options in (("greedy", {}), ("speculative", {"draft": "prompt-lookup"}),
                              ("speculative", {"draft": "prompt-lookup", "do_sample": True})):
        events = list(run_strategy(target, settings(group, prompt="x Paris x", strategy=strategy, logit_bias=banned,
                                                    **options)))
        assert tokens_of(events) == []
        ends.append((events[-1].stop_reason, events[-1].stop_note))
    assert ends[0] == ends[1] == ends[2] and ends[0][0] == "grammar_blocked"


def test_a_sampled_run_under_a_schema_writes_json_that_validates(runs):
    _, events = runs["model-chain-schema-sampled"]
    done = events[-1]
    assert isinstance(done, RunFinished) and done.stop_reason == "grammar"
    value = json.loads(done.text)
    assert set(value) == {"name", "age", "pet"} and value["pet"] in ("cat", "dog", "none")
    assert isinstance(value["name"], str) and len(value["name"]) <= 24 and isinstance(value["age"], int)


# -- 2. the grammar's verdicts, asked of a fresh matcher ---------------------------------------------------------------

def fresh(ll_tok, group: GrammarSettings, prefix: list[int]):
    matcher = llguidance.LLMatcher(ll_tok, check_constraint(group), log_level=0)
    assert matcher.consume_tokens(prefix), matcher.get_error()
    return matcher


def allowed_here(matcher, ll_tok, token: int, eos: int) -> bool:
    """The library's matcher asked about one token (``validate_tokens``), with llguidance's two documented rules: the
    end token where the grammar accepts; where it forces bytes, only the first token of their canonical tokenization
    (its fast-forward tokens), not a shorter piece of them."""
    if token == eos:
        return matcher.is_accepting()
    forced, ff = matcher.compute_ff_bytes(), matcher.compute_ff_tokens()
    piece = ll_tok.decode_bytes([token])
    return matcher.validate_tokens([token]) == 1 and not (
        ff and token != ff[0] and len(piece) < len(forced) and forced.startswith(piece))


def allowed_count(matcher, vocab: int, eos: int) -> int:
    """Tokens the library's mask allows (its bitmask, popcounted here), the end token where the grammar accepts."""
    bits = 0
    mask = matcher.compute_bitmask()
    words = [int.from_bytes(mask[i : i + 4], "little") for i in range(0, len(mask), 4)]
    for w, word in enumerate(words):
        top = min(32, vocab - 32 * w)
        if top > 0:
            bits += bin(word & ((1 << top) - 1)).count("1")
    eos_bit = bool(words[eos // 32] >> (eos % 32) & 1)
    return bits + int(matcher.is_accepting() and not eos_bit)


def recount(events: list, group: GrammarSettings, ll_tok, vocab: int, eos: int) -> dict[str, list[int]]:
    """Every drafted token asked of a fresh matcher fed the output before its round and its ancestors: is it allowed,
    and how many tokens are allowed there (forced: one; inside: fewer than half the vocabulary)."""
    output = tokens_of(events)
    counts = {span: [0, 0, 0] for span in ("forced", "inside", "outside")}  # drafted, accepted, grammar-rejected
    for r in rounds_of(events):
        parents = r.parents or tuple(range(-1, len(r.drafted) - 1))
        for i, d in enumerate(r.drafted):
            path, node = [], parents[i]
            while node >= 0:
                path.insert(0, r.drafted[node].token_id)
                node = parents[node]
            matcher = fresh(ll_tok, group, output[: r.first_step] + path)
            allowed = allowed_here(matcher, ll_tok, d.token_id, eos)
            n = allowed_count(matcher, vocab, eos)
            span = "forced" if n == 1 else "inside" if 2 * n < vocab else "outside"
            assert d.grammar_rejected == (not allowed), (r.round, i, d.text)
            assert (d.span, d.allowed) == (span, n), (r.round, i, d.text)
            counts[span][0] += 1
            counts[span][1] += i < r.accepted  # the accepted path comes first in ``drafted``
            counts[span][2] += not allowed
    return counts


@pytest.mark.parametrize("case", [*CASES, "model-chain-schema-sampled"])
def test_the_grammar_rejected_drafts_and_the_spans_are_a_fresh_matchers(runs, case, ll_tok, target):
    group = CASES[case][0] if case in CASES else SCHEMA
    _, events = runs[case]
    vocab, eos = len(target.tokenizer), target.tokenizer.eos_token_id
    counts = recount(events, group, ll_tok, vocab, eos)
    figures = events[-1].figures
    assert figures["grammar_rejected"] == sum(c[2] for c in counts.values()) > 0
    for span, (drafted, accepted, rejected) in counts.items():
        assert (figures[f"drafted_{span}"], figures[f"accepted_{span}"], figures[f"grammar_rejected_{span}"]) == \
            (drafted, accepted, rejected), span
    free = [a + b for a, b in zip(counts["inside"], counts["outside"], strict=True)]
    assert (figures["drafted_free"], figures["accepted_free"]) == (free[0], free[1])
    if case == "model-chain-schema":
        assert counts["forced"][0] > 0 and counts["inside"][0] > 0, "precondition: forced and free steps drafted"
    # a grammar-rejected draft never reached the target's pass: its target p is 0 (the row is masked) and it is not
    # in the output
    for r in rounds_of(events):
        for d in r.drafted:
            if d.grammar_rejected:
                assert d.target_prob == 0.0 and not d.accepted


# -- 3. sampled verification with a forbidden draft --------------------------------------------------------------------

def test_sampled_verification_with_a_forbidden_draft_emits_the_constrained_targets_distribution(target):
    """Reference argument: a draft x ~ q that the grammar forbids has p(x) = 0 under the constrained target, so the
    rejection rule rejects it for certain and draws from normalise(max(0, p − q)); the first token is then
    distributed as p (Leviathan et al.'s proof holds with p(x) = 0). Dropping the draft before the rule and drawing
    from p instead gives min(p, q) + (Σ_allowed max(0, q − p))·r + q(forbidden)·p ≠ p. Checked here by drawing: p is
    even on the n tokens the choices allow first; q puts half its mass on one of them (" cats") and half on a token
    the grammar forbids. Then P(" cats") = ½·min(1, (1/n)/½) = 1/n; dropping the forbidden draft gives 1.5/n."""
    s = settings(GrammarSettings(choices=(" cats", " dogs")), prompt="x", strategy="speculative", do_sample=True,
                 draft="prompt-lookup")
    built = next(g for g in build_pipeline(s, sampling=True, tokenizer=target.tokenizer,
                                           vocab_size=len(target.tokenizer), carried=("grammar",))
                 if isinstance(g, Grammar))
    tok = target.tokenizer
    cats, forbidden = tok.encode(" cats")[0], tok.encode(" mice")[0]
    allowed = set(torch.nonzero(built.allowed().mask).flatten().tolist())
    n = len(allowed)
    vocab = 8192  # the rows cut to the ids that matter here (a draw over 49,152 tokens costs ~5 ms on this machine)
    assert cats in allowed and forbidden not in allowed and 2 <= n <= 20 and max(allowed | {forbidden}) < vocab
    grammar = Grammar(built.matcher, vocab, built.eos_ids, built.kind)
    processed = grammar.apply(torch.zeros((1, 1), dtype=torch.long), torch.zeros((1, vocab)))  # even on the allowed
    q = torch.zeros(vocab)
    q[cats] = q[forbidden] = 0.5
    generator = torch.Generator().manual_seed(0)
    first = Counter()
    trials = 600
    for _ in range(trials):
        x = cats if float(torch.rand((), generator=generator)) < 0.5 else forbidden  # x ~ q
        tree = chain([x])
        tree.probs = q[None]
        judged = judge_draft(grammar, tree)
        rows = judged.rows(torch.cat([processed] * (len(judged.kept) + 1)))  # the bonus row: not read here
        verdict, _ = decode_module._verify(judged.tree, rows, True, generator, False)
        first[judged.tree.tokens[0] if verdict.accepted else verdict.token_id] += 1
    assert set(first) <= allowed
    expected = 1 / n
    sigma = (expected * (1 - expected) / trials) ** 0.5
    assert abs(first[cats] / trials - expected) < 3 * sigma < 0.5 / n, (first[cats] / trials, expected)


# -- 4. the view -------------------------------------------------------------------------------------------------------

def test_the_view_draws_the_grammars_marks_and_the_split_figures(runs, ll_tok, target, qtbot):
    from PySide6.QtGui import QColor, QTextCursor

    from playground.state import Run
    from playground.state.speculative import GRAMMAR, rejected_nodes
    from playground.ui.style import configure_pyqtgraph, format_percent
    from playground.ui.views.speculative import SpeculativeView
    from playground.ui.views.speculative.text import GRAMMAR_COLOR, mark_tooltip

    _, events = runs["model-chain-schema"]
    counts = recount(events, SCHEMA, ll_tok, len(target.tokenizer), target.tokenizer.eos_token_id)
    configure_pyqtgraph()
    view = SpeculativeView()
    qtbot.addWidget(view)
    view.resize(1200, 700)
    view.show_run(Run.from_events(events))
    # every grammar-rejected draft the text shows (a chain's draft after its accepted prefix): magenta, struck through
    expected = [r.drafted[i].text for r in rounds_of(events) for i in rejected_nodes(r)
                if r.drafted[i].grammar_rejected]
    assert expected
    shown = []
    doc = view.text.document()
    for index, mark in enumerate(view.state.marks):
        probe = QTextCursor(doc)
        probe.setPosition(view.text.starts[index] + 1)
        fmt = probe.charFormat()
        is_grammar = fmt.foreground().color() == QColor(GRAMMAR_COLOR)
        assert is_grammar == (mark.kind == GRAMMAR)
        if is_grammar:
            assert fmt.fontStrikeOut()
            assert "rejected by the grammar" in mark_tooltip(view.state, index)
            shown.append(mark.text)
    assert shown == expected
    text = re.sub(r"</?b>", "", view.figures.text())
    rejected = sum(c[2] for c in counts.values())

    def part(name: str, drafted: int, accepted: int) -> str:
        return f"{name} {accepted}/{drafted}" + (f" ({format_percent(accepted / drafted)})" if drafted else "")

    free = [a + b for a, b in zip(counts["inside"], counts["outside"], strict=True)]
    assert (f"Under the constraint: {rejected} drafts rejected by the grammar before verification · accepted at "
            f"{part('forced steps', *counts['forced'][:2])}, {part('free steps', *free[:2])} · "
            f"{part('inside constrained spans', *counts['inside'][:2])}, {part('outside', *counts['outside'][:2])}"
            ) in text
