"""Fast-forward tokens from one batched pass: a constrained run feeds the tokens the grammar fixes (the only one
its state allows) to the model together, in one pass, and records each as a real step marked fast-forward.

- The tokens equal a constrained greedy decoded here step by step, with the library's own matcher and a forward
  pass of the whole sequence (no cache) per step.
- Each fast-forward step's probabilities equal that full-sequence pass at its position.
- The model's forward calls drop to one per free step (counted with a forward hook).
- The loop's rules hold across the batched tokens: the budget counts them, Stop comes between them, a stop string
  cuts them, a ban's rollback undoes them; sampling draws the same tokens as step by step.
- A saved run keeps the mark, and a run saved before it reads False.

A tiny random model on tests/support's 320-token tokenizer: its long keys take many small fixed tokens."""

from __future__ import annotations

import dataclasses
import json
import math

import llguidance
import llguidance.hf
import pytest
import torch

import playground.engine.fast_forward as fast_forward
from playground.config import RunSettings
from playground.config.samplers.grammar import GrammarSettings, check_constraint
from playground.engine.run_context import RunContext
from playground.engine.sampling import run_sampling
from playground.events import Rollback, RunFinished, TokenStep, dumps_event, event_from_dict

SCHEMA = {
    "type": "object",
    "properties": {
        "customer_full_name": {"type": "string", "maxLength": 5},
        "shipping_destination_country": {"enum": ["France", "Japan"]},
    },
    "required": ["customer_full_name", "shipping_destination_country"],
    "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},
}
GROUP = GrammarSettings(json_schema=json.dumps(SCHEMA))
PROMPT = "Answer:"


def _settings(**flat) -> RunSettings:
    base = dict(prompt=PROMPT, chat=False, strategy="greedy", max_new_tokens=80, seed=0)
    return RunSettings.from_flat(**{**base, **flat}).with_group(GROUP).validate()


def _steps(events) -> list[TokenStep]:
    return [e for e in events if isinstance(e, TokenStep)]


@pytest.fixture(scope="module")
def lm(tiny_lm):
    return tiny_lm


@pytest.fixture(scope="module")
def counted(lm):
    """One constrained greedy run and the model's forward calls during it."""
    calls = [0]
    hook = lm.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        events = list(run_sampling(lm, _settings()))
    finally:
        hook.remove()
    return events, calls[0]


@pytest.fixture(scope="module")
def reference(lm):
    """Constrained greedy decoded here: a fresh matcher masks each step (an end token only where it accepts), and
    the whole sequence goes through the model with no cache. Returns (tokens, whether each step allowed one token
    only, the prompt's ids)."""
    tok = lm.tokenizer
    eos = tok.eos_token_id
    ll_tok = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok))
    matcher = llguidance.LLMatcher(ll_tok, check_constraint(GROUP), log_level=0)
    prompt = tok.encode(PROMPT)
    tokens: list[int] = []
    single: list[bool] = []
    with torch.no_grad():
        while not matcher.is_stopped() and len(tokens) < 80:
            bits = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.uint8)
            mask = ((bits.unsqueeze(1) >> torch.arange(8)) & 1).flatten()[: len(tok)].bool()
            mask[eos] = matcher.is_accepting()
            logits = lm.model(input_ids=torch.tensor([prompt + tokens])).logits[0, -1]
            token = int(logits.masked_fill(~mask, -math.inf).argmax())
            single.append(int(mask.sum()) == 1)
            if token == eos:
                break
            assert matcher.consume_token(token), matcher.get_error()
            tokens.append(token)
    return tokens, single, prompt


def test_the_tokens_equal_step_by_step_constrained_greedy(counted, reference):
    events, _ = counted
    tokens, _, _ = reference
    steps = _steps(events)
    assert [s.token_id for s in steps] == tokens
    assert events[-1].stop_reason == "grammar"
    assert sum(s.grammar.fast_forward for s in steps) > len(steps) / 2  # the long keys are fixed tokens


def test_fast_forward_steps_are_the_fixed_ones_with_the_probabilities_of_a_full_pass(lm, counted, reference):
    events, _ = counted
    tokens, single, prompt = reference
    steps = _steps(events)
    # A step is fast-forward when its token is fixed (the only one allowed) and a later pass fed it: every fixed
    # step but the first (the prefill's logits serve it, and a pass feeds only the tokens after the newest).
    assert [s.grammar.fast_forward for s in steps] == [i > 0 and single[i] for i in range(len(steps))]
    with torch.no_grad():
        full = lm.model(input_ids=torch.tensor([prompt + tokens])).logits[0].float().log_softmax(-1)
    for i, step in enumerate(steps):
        if not step.grammar.fast_forward:
            continue
        row = full[len(prompt) + i - 1]  # the distribution the token at output position i was drawn from
        assert step.logprob == pytest.approx(float(row[step.token_id]), abs=1e-4)
        assert step.raw_prob == pytest.approx(float(row[step.token_id].exp()), abs=1e-4)
        assert step.grammar.removed_mass == pytest.approx(1 - float(row[step.token_id].exp()), abs=1e-4)
        for c in step.candidates:
            assert c.raw_prob == pytest.approx(float(row[c.token_id].exp()), abs=1e-4)
        assert step.entropy == pytest.approx(float(-(row.exp() * row).sum()) / math.log(2), abs=1e-4)


def test_a_fixed_token_costs_no_forward_call_of_its_own(counted, reference):
    events, calls = counted
    _, single, _ = reference
    n = len(_steps(events))
    # The prefill serves step 0; a step i >= 1 needs a pass unless the token before it was fixed and fed (i-1 >= 1).
    expected = 1 + sum(1 for i in range(1, n) if not (i - 1 >= 1 and single[i - 1]))
    assert calls == expected
    assert calls < n / 3  # step by step: one call per token (n)


def _step_by_step(monkeypatch, lm, settings, context=None):
    with monkeypatch.context() as m:
        m.setattr(fast_forward, "MAX_RUN", 0)  # no run of fixed tokens is fed ahead: one pass per token
        return list(run_sampling(lm, settings, context))


def _same_run(a, b) -> None:
    """The same tokens and rollbacks, in the same order, with the same probabilities (within a batched pass's
    rounding)."""
    kinds = [(type(e).__name__, getattr(e, "token_id", getattr(e, "position", None))) for e in a]
    assert kinds == [(type(e).__name__, getattr(e, "token_id", getattr(e, "position", None))) for e in b]
    for x, y in zip(_steps(a), _steps(b), strict=True):
        assert x.raw_prob == pytest.approx(y.raw_prob, abs=1e-4)
    assert (a[-1].stop_reason, a[-1].text) == (b[-1].stop_reason, b[-1].text)


def test_sampling_draws_the_same_tokens_as_step_by_step(monkeypatch, lm):
    for seed in (1, 2):
        settings = _settings(strategy="sample", seed=seed, temperature=1.5)
        fed = list(run_sampling(lm, settings))
        assert any(s.grammar.fast_forward for s in _steps(fed))
        _same_run(fed, _step_by_step(monkeypatch, lm, settings))


def test_the_budget_a_stop_string_and_stop_cut_a_run_of_fixed_tokens(monkeypatch, lm, counted):
    events, _ = counted
    steps = _steps(events)
    first_ff = next(i for i, s in enumerate(steps) if s.grammar.fast_forward)
    budget = first_ff + 3  # ends inside the first run of fixed tokens
    short = list(run_sampling(lm, _settings(max_new_tokens=budget)))
    assert len(_steps(short)) == budget and short[-1].stop_reason == "grammar_incomplete"
    assert [s.token_id for s in _steps(short)] == [s.token_id for s in steps[:budget]]

    words = "destination"  # inside the second key: all fixed tokens
    cut = list(run_sampling(lm, _settings(stop_strings=(words,))))
    assert cut[-1].stop_reason == "stop_string" and cut[-1].text.endswith(words)
    _same_run(cut, _step_by_step(monkeypatch, lm, _settings(stop_strings=(words,))))

    seen = []

    def stop_after_five() -> bool:
        return len(seen) >= first_ff + 5

    stopped = []
    for event in run_sampling(lm, _settings(), RunContext.of(stop_after_five)):
        stopped.append(event)
        if isinstance(event, TokenStep):
            seen.append(event)
    assert stopped[-1].stop_reason == "stopped" and len(_steps(stopped)) == first_ff + 5


def test_with_the_lens_each_token_has_its_own_pass_and_layers(lm):
    from playground.events.layers import LayerStep

    events = list(run_sampling(lm, _settings(lens=True, max_new_tokens=10)))
    steps = _steps(events)
    assert len(steps) == 10 and not any(s.grammar.fast_forward for s in steps)
    assert [e.step for e in events if isinstance(e, LayerStep)] == list(range(10))


@pytest.fixture(scope="module")
def banned(lm, counted):
    """The constrained run with greedy's own country banned: (its settings, its events)."""
    events, _ = counted
    country = json.loads(events[-1].text)["shipping_destination_country"]
    settings = _settings(ban=(country,))
    return settings, list(run_sampling(lm, settings))


def test_a_ban_rolls_back_a_run_of_fixed_tokens(monkeypatch, lm, counted, banned):
    events, _ = counted
    country = json.loads(events[-1].text)["shipping_destination_country"]  # greedy's own choice, then banned
    settings, fed = banned
    rollbacks = [e for e in fed if isinstance(e, Rollback)]
    assert rollbacks and any(s.grammar.fast_forward for s in _steps(fed))
    other = "Japan" if country == "France" else "France"
    assert json.loads(fed[-1].text)["shipping_destination_country"] == other
    _same_run(fed, _step_by_step(monkeypatch, lm, settings))


def test_a_saved_run_keeps_the_mark_and_an_old_one_reads_false(counted):
    events, _ = counted
    steps = _steps(events)
    marked = next(s for s in steps if s.grammar.fast_forward)
    again = event_from_dict(json.loads(dumps_event(marked)))
    assert again == marked and again.grammar.fast_forward
    old = json.loads(dumps_event(marked))
    del old["grammar"]["fast_forward"]
    assert event_from_dict(old).grammar == dataclasses.replace(marked.grammar, fast_forward=False)
    assert isinstance(events[-1], RunFinished)


def test_the_tokens_view_marks_fast_forward_tokens_and_says_so_on_hover(qtbot, tmp_path, counted):
    from PySide6.QtGui import QTextCharFormat, QTextCursor

    from playground.state.session import Run
    from playground.ui.views.tokens import TokensView
    from playground.ui.views.tokens.grammar_line import FAST_FORWARD_COLOR, FAST_FORWARD_ON_DARK
    from playground.ui.views.tokens.tooltip import token_tooltip_html

    events, _ = counted
    view = TokensView()
    qtbot.addWidget(view)
    view.show_run(Run.from_events(events))
    edit = view.token_view.text
    assert [s.token_id for s in edit.steps] == [s.token_id for s in _steps(events)]
    dashed = QTextCharFormat.UnderlineStyle.DashUnderline
    for step, start in zip(edit.steps, edit._starts, strict=True):
        cursor = QTextCursor(edit.document())
        cursor.setPosition(start + 1)  # the format of the token's first character
        assert (cursor.charFormat().underlineStyle() == dashed) == step.grammar.fast_forward, step
        assert ("fast-forward" in token_tooltip_html(step)) == step.grammar.fast_forward
    view.resize(700, 400)
    view.grab().save(str(tmp_path / "marked.png"))
    unmarked = [dataclasses.replace(e, grammar=dataclasses.replace(e.grammar, fast_forward=False))
                if isinstance(e, TokenStep) else e for e in events]
    view.show_run(Run.from_events(unmarked))
    view.grab().save(str(tmp_path / "unmarked.png"))
    colors = (FAST_FORWARD_COLOR, FAST_FORWARD_ON_DARK)
    assert _pixels(tmp_path / "marked.png", *colors) > 100 and _pixels(tmp_path / "unmarked.png", *colors) == 0


def _pixels(path, *colors: str) -> int:
    """How many of the PNG's pixels have one of ``colors``."""
    import numpy as np
    from PySide6.QtGui import QColor, QImage

    image = QImage(str(path)).convertToFormat(QImage.Format.Format_RGB32)
    pixels = np.frombuffer(image.constBits(), dtype=np.uint32).reshape(image.height(), -1)[:, : image.width()]
    return int(np.isin(pixels & 0xFFFFFF, [QColor(c).rgb() & 0xFFFFFF for c in colors]).sum())


def test_shot_from_a_saved_constrained_run_and_a_ban_run_draws_their_marks(qapp, tmp_path, monkeypatch, counted,
                                                                           banned):
    """The saved runs render without a model: the constrained one with its fast-forward underlines, the ban run
    with its struck spans (each mark's own colour counted in the PNG, against a run without it)."""
    from playground.cli import main
    from playground.traces import write_trace
    from playground.ui.views.tokens.grammar_line import FAST_FORWARD_COLOR, FAST_FORWARD_ON_DARK
    from playground.ui.views.tokens.rollbacks import UNDONE_BG

    events, _ = counted
    write_trace(events, tmp_path / "grammar.jsonl")
    write_trace(banned[1], tmp_path / "ban.jsonl")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "no-cache"))  # no model here
    for name in ("grammar", "ban"):
        assert main(["shot", "--from-trace", str(tmp_path / f"{name}.jsonl"), "--view", "tokens", "--out",
                     str(tmp_path / f"{name}.png")]) == 0
    # The underline's colours are the mark's alone (the view's test below: none in a run without the mark).
    assert _pixels(tmp_path / "grammar.png", FAST_FORWARD_COLOR, FAST_FORWARD_ON_DARK) > 100
    assert _pixels(tmp_path / "ban.png", UNDONE_BG) > 100
    assert _pixels(tmp_path / "grammar.png", UNDONE_BG) == 0
