"""Phrase bans with backtracking (--ban, --ban-regex): a banned phrase never appears in the output over many seeds;
each rollback undoes exactly the span that began it (the timeline is rebuilt here from the events); the forbidden
token is not taken again at its position; greedy with bans equals a reference decoded here with no cache; mirostat's
mu after a rollback is the one computed here from the surviving tokens; the logits after a rollback are a fresh
forward pass of the surviving prefix (the cache was cropped); impossible bans and the rollback limit end the run with
their reasons; bad settings are refused before the first event; saved runs keep the rollbacks."""

from __future__ import annotations

import math
import re

import pytest
import torch

from playground.config import ConfigError, RunSettings
from playground.engine.sampling import run_sampling
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, TokenStep, dumps_event, event_from_dict
from playground.events.bans import Rollback
from playground.state.session import Run

PROMPT = "The capital of France is"


def _settings(**values) -> RunSettings:
    base = dict(strategy="greedy", prompt=PROMPT, chat=False, max_new_tokens=24)
    return RunSettings.from_flat(**{**base, **values})


def _events(lm, **values):
    return list(run_sampling(lm, _settings(**values)))


def _ascii_phrase(text: str, start: int, size: int = 3) -> str | None:
    """A printable-ASCII substring of ``text`` of ``size`` characters from ``start`` on."""
    for at in range(start, len(text) - size + 1):
        piece = text[at : at + size]
        if all(32 < ord(ch) < 127 for ch in piece):
            return piece
    return None


def _timeline(lm, events):
    """Replay the events: the live tokens [(id, text)], checking every rollback against them. Returns (the
    surviving ids, the rollbacks, the steps taken at each (position, after how many rollbacks))."""
    live: list[tuple[int, str]] = []
    rollbacks = []
    forbidden: dict[int, set[int]] = {}
    for event in events:
        if isinstance(event, TokenStep):
            assert event.step == len(live), "a step's number is its position in the surviving output"
            if not event.forced:
                assert event.token_id not in forbidden.get(event.step, set()), \
                    f"token {event.token_id} was forbidden at {event.step} and taken again"
            live.append((event.token_id, event.text))
        elif isinstance(event, Rollback):
            p = event.position
            text = "".join(t for _, t in live)
            starts = [sum(len(t) for _, t in live[:i]) for i in range(len(live) + 1)]
            # The undone tokens are exactly the live ones from the position on.
            assert tuple(i for i, _ in live[p:]) == event.token_ids
            assert tuple(t for _, t in live[p:]) == event.texts
            # The match is in the text where the event says, and the text before the last token had none.
            if event.kind == "phrase":
                assert text[event.match_start :].startswith(event.banned)
                assert event.banned not in text[: starts[-2]]
            else:
                assert re.compile(event.banned).search(text) is not None
                assert re.compile(event.banned).search(text[: starts[-2]]) is None
            assert text.find(event.banned) == event.match_start if event.kind == "phrase" else True
            # The position is the first token whose text holds the match's first character (or the tokens with no
            # text of their own just before it, which began that character).
            holder = next(i for i in range(len(live)) if starts[i] <= event.match_start < starts[i + 1])
            assert p <= holder and all(not t for _, t in live[p:holder])
            assert p == holder or starts[holder] == event.match_start, "walked back past a character it did not begin"
            assert p == 0 or live[p - 1][1] or p == holder or len(live) == 0
            assert event.forbidden == live[p][0]
            for later in [k for k in forbidden if k > p]:
                del forbidden[later]
            forbidden.setdefault(p, set()).add(event.forbidden)
            assert event.forbidden_count == len(forbidden[p])
            del live[p:]
            rollbacks.append(event)
    done = events[-1]
    assert isinstance(done, RunFinished)
    assert done.token_ids == tuple(i for i, _ in live), "the run's tokens are the ones that survived"
    assert done.text == lm.tokenizer.decode(list(done.token_ids), skip_special_tokens=True)
    assert done.figures["rollbacks"] == len(rollbacks)
    assert done.figures["rollback_tokens"] == sum(len(r.token_ids) for r in rollbacks)
    return [i for i, _ in live], rollbacks


@pytest.mark.parametrize("strategy", ["greedy", "sample"])
def test_a_banned_phrase_never_appears_and_each_rollback_undoes_its_span(tiny_lm, strategy):
    rolled = 0
    for seed in range(12):
        plain = _events(tiny_lm, strategy=strategy, seed=seed, temperature=0.7)
        text = plain[-1].text
        phrase = _ascii_phrase(text, 4)
        if phrase is None:
            continue
        events = _events(tiny_lm, strategy=strategy, seed=seed, temperature=0.7, ban=(phrase,))
        live, rollbacks = _timeline(tiny_lm, events)
        assert phrase not in events[-1].text, (seed, phrase, events[-1].text)
        assert rollbacks, f"seed {seed}: the phrase {phrase!r} of the plain run was never met"
        # Up to the first rollback the run is the plain one (the same seed, nothing forbidden yet).
        first = rollbacks[0]
        plain_ids = [e.token_id for e in plain if isinstance(e, TokenStep)]
        assert list(first.token_ids) == plain_ids[first.position : first.position + len(first.token_ids)]
        assert live[: first.position] == plain_ids[: first.position], "the surviving prefix changed"
        rolled += len(rollbacks)
    assert rolled >= 12


def test_regex_bans_keep_every_match_out(tiny_lm):
    rolled = 0
    for seed in range(8):
        events = _events(tiny_lm, strategy="sample", seed=seed, ban_regex=(r"[aeiou]{2}", r"\d"))
        rolled += len(_timeline(tiny_lm, events)[1])
        text = events[-1].text
        assert re.search(r"[aeiou]{2}|\d", text) is None, (seed, text)
    assert rolled >= 4


def _reference_greedy(lm, prompt_ids, bans, budget, limit=64):
    """Antislop by hand: greedy over full forward passes (no cache); on a banned phrase in the decoded output, go
    back to the token that holds its first character, forbid it there, forget later positions' sets, go on."""
    tok = lm.tokenizer
    eos = set(lm.eos_token_ids)
    gen: list[int] = []
    forbidden: dict[int, set[int]] = {}
    rollbacks = 0
    while len(gen) < budget:
        with torch.no_grad():
            logits = lm.model(torch.tensor([prompt_ids + gen])).logits[0, -1].float()
        for t in forbidden.get(len(gen), ()):
            logits[t] = float("-inf")
        token = int(logits.argmax())
        gen.append(token)
        if token in eos:
            break
        text = tok.decode(gen, skip_special_tokens=False)
        hits = [text.find(b) for b in bans if b in text]
        if not hits:
            continue
        start = min(hits)
        p = next(i for i in range(len(gen)) if len(pre := tok.decode(gen[: i + 1])) > start
                 and pre[: start + 1] == text[: start + 1])
        while p > 0 and (pre := tok.decode(gen[:p])).endswith("\ufffd") and len(pre.rstrip("\ufffd")) == start:
            p -= 1  # the partial bytes before it began the match's first character
        forbidden = {k: v for k, v in forbidden.items() if k <= p}
        forbidden.setdefault(p, set()).add(gen[p])
        del gen[p:]
        rollbacks += 1
        if rollbacks >= limit:
            break
    return gen, rollbacks


def test_greedy_with_bans_equals_a_reference_decoded_without_a_cache(tiny_lm):
    checked = 0
    prompts = [PROMPT, "Beam search keeps", "Sampling draws from the", "I would like a cup of"]
    for prompt in prompts:
        plain = list(run_sampling(tiny_lm, _settings(prompt=prompt)))
        text = plain[-1].text
        bans = tuple(b for b in (_ascii_phrase(text, 2, 2), _ascii_phrase(text, 10, 3)) if b)
        if not bans:
            continue
        events = list(run_sampling(tiny_lm, _settings(prompt=prompt, ban=bans)))
        live, rollbacks = _timeline(tiny_lm, events)
        prompt_ids = tiny_lm.tokenizer(prompt)["input_ids"]
        start = next(e for e in events if type(e).__name__ == "RunStarted")
        assert list(start.prompt_token_ids) == prompt_ids
        ref, ref_rollbacks = _reference_greedy(tiny_lm, prompt_ids, bans, 24)
        assert live == ref, prompt
        assert len(rollbacks) == ref_rollbacks
        checked += bool(rollbacks)
    assert checked >= 3


def test_the_logits_after_a_rollback_are_a_fresh_pass_of_the_surviving_prefix(tiny_lm):
    """The cache was cropped: every surviving step's raw probabilities equal a full forward pass here."""
    text = _events(tiny_lm)[-1].text
    phrase = _ascii_phrase(text, 3)
    events = _events(tiny_lm, ban=(phrase,), num_candidates=8)
    live, rollbacks = _timeline(tiny_lm, events)
    assert rollbacks
    prompt_ids = tiny_lm.tokenizer(PROMPT)["input_ids"]
    steps = [e for e in events if isinstance(e, TokenStep)]
    after = {r.position for r in rollbacks}
    survivors = {}
    for step in steps:
        survivors[step.step] = step  # the last step at each position is the surviving one
    for position in range(len(live)):
        with torch.no_grad():
            probs = tiny_lm.model(torch.tensor([prompt_ids + live[:position]])).logits[0, -1].float().softmax(-1)
        for c in survivors[position].candidates:
            assert math.isclose(c.raw_prob, float(probs[c.token_id]), rel_tol=1e-4, abs_tol=1e-6), position
    assert after & set(range(len(live)))


def test_mirostat_mu_after_a_rollback_is_the_mu_of_the_surviving_tokens(tiny_lm):
    tau, eta = 3.0, 0.1
    met = 0
    for seed in range(6):
        plain = _events(tiny_lm, strategy="sample", seed=seed, mirostat=2, mirostat_tau=tau, mirostat_eta=eta)
        phrase = _ascii_phrase(plain[-1].text, 4)
        if phrase is None:
            continue
        events = _events(tiny_lm, strategy="sample", seed=seed, mirostat=2, mirostat_tau=tau, mirostat_eta=eta,
                         ban=(phrase,))
        live, rollbacks = _timeline(tiny_lm, events)
        met += len(rollbacks)
        survivors = {}
        for event in events:
            if isinstance(event, TokenStep):
                survivors[event.step] = event
        mu = 2 * tau
        for position in range(len(live)):
            step = survivors[position]
            assert math.isclose(step.mirostat_mu, mu, rel_tol=1e-6, abs_tol=1e-9), (seed, position)
            mu -= eta * (-math.log2(step.prob) - tau)
    assert met >= 3


def test_a_ban_that_forbids_every_token_left_ends_the_run_with_a_message(tiny_lm):
    # top-k before the ban: three tokens are left at each step, and a ban on any character forbids them in turn.
    events = _events(tiny_lm, strategy="sample", samplers="top_k;ban", top_k=3, ban_regex=(r"[\s\S]",))
    done = events[-1]
    assert done.stop_reason == "ban_blocked"
    assert "no token is left at output token 0" in done.stop_note and "3 tokens" in done.stop_note
    assert [r.forbidden_count for r in events if isinstance(r, Rollback)] == [1, 2, 3]
    assert done.token_ids == ()


def test_the_rollback_limit_ends_the_run(tiny_lm):
    events = _events(tiny_lm, ban_regex=(r"[\s\S]",), ban_max_rollbacks=5)
    done = events[-1]
    assert done.stop_reason == "ban_limit" and "5 times" in done.stop_note
    assert sum(isinstance(e, Rollback) for e in events) == 5 and done.figures["rollbacks"] == 5


def test_bad_bans_are_refused_before_the_first_event(tiny_lm):
    with pytest.raises(ConfigError, match=r"--ban-regex '\(a': missing \), unterminated subpattern at position 0"):
        run_sampling(tiny_lm, _settings(ban_regex=("(a",)))
    with pytest.raises(ConfigError, match="matches the empty string"):
        run_sampling(tiny_lm, _settings(ban_regex=("x?",)))
    for strategy in ("beam", "speculative", "contrastive"):
        with pytest.raises(ConfigError, match=r"ban is not available with the \w+ strategy"):
            list(run_strategy(tiny_lm, _settings(strategy=strategy, ban=("the",))))
    with pytest.raises(ConfigError, match="negative context"):
        run_sampling(tiny_lm, _settings(ban=("the",), guidance_scale=1.5))


def test_a_model_with_sliding_window_layers_is_refused_by_name():
    from support.tiny_models import build_tiny_lm

    lm = build_tiny_lm(family="mistral")
    with pytest.raises(ConfigError, match="sliding-window"):
        run_sampling(lm, _settings(ban=("the",)))


def test_a_saved_run_keeps_its_rollbacks_and_its_surviving_tokens(tiny_lm):
    phrase = _ascii_phrase(_events(tiny_lm)[-1].text, 3)
    events = _events(tiny_lm, ban=(phrase,))
    back = [event_from_dict(__import__("json").loads(dumps_event(e))) for e in events]
    assert back == events
    run = Run.from_events(back)
    assert run.rollbacks == [e for e in events if isinstance(e, Rollback)] and run.rollbacks
    assert tuple(s.token_id for s in run.steps) == events[-1].token_ids
    assert [s.step for s in run.steps] == list(range(len(run.steps)))


def test_the_command_line_takes_repeated_bans_and_a_saved_trace_keeps_them(tmp_path, model_folder):
    from playground.cli import build_parser, main, settings_from_args
    from playground.config.samplers.ban import BanSettings
    from playground.traces import read_trace

    argv = ["--model", str(model_folder), "--no-chat", "--prompt", PROMPT, "--strategy", "greedy",
            "--max-new-tokens", "16", "--ban", " the", "--ban", "a|b", "--ban-regex", r"\w\w|\d",
            "--ban-max-rollbacks", "9"]
    _, settings = settings_from_args(build_parser().parse_args(["trace", *argv]))
    assert settings.group(BanSettings) == BanSettings(ban=(" the", "a|b"), ban_regex=(r"\w\w|\d",),
                                                      ban_max_rollbacks=9)
    assert main(["trace", *argv, "--out", str(tmp_path / "run.jsonl")]) == 0
    saved = read_trace(tmp_path / "run.jsonl")
    rollbacks = [e for e in saved.events if isinstance(e, Rollback)]
    done = saved.events[-1]
    assert rollbacks and isinstance(done, RunFinished) and done.figures["rollbacks"] == len(rollbacks)
    assert re.search(r"\w\w|\d", done.text) is None or done.stop_reason == "ban_limit"
    assert main(["trace", *argv[:-2], "--ban-regex", "(x", "--out", str(tmp_path / "bad.jsonl")]) == 2


def test_a_constraint_and_bans_together_keep_both(tiny_lm):
    """The grammar's matcher is rolled back with the tokens: every output still matches the regex, none holds the
    ban (a matcher left where the undone tokens took it would refuse the next tokens or let a wrong text through)."""
    pattern = r"(cat|dog)s? [0-9]{1,3}"
    rolled = 0
    for seed in range(16):
        events = _events(tiny_lm, strategy="sample", seed=seed, regex=pattern, ban=("s ",), max_new_tokens=12)
        done = events[-1]
        rolled += len(_timeline(tiny_lm, events)[1])
        assert done.stop_reason in ("eos", "grammar", "max_new_tokens"), (seed, done.stop_reason, done.stop_note)
        assert re.fullmatch(pattern, done.text) and "s " not in done.text, (seed, done.text)
    assert rolled >= 3


def test_tokens_forced_by_hand_are_not_rolled_back(tiny_lm):
    forced = tuple(tiny_lm.tokenizer(" the cat")["input_ids"])
    events = _events(tiny_lm, forced_token_ids=forced, ban=("cat",), max_new_tokens=10)
    live, rollbacks = _timeline(tiny_lm, events)
    assert tuple(live[: len(forced)]) == forced
    assert all(r.position >= len(forced) for r in rollbacks)
    assert "cat" not in tiny_lm.tokenizer.decode(live[len(forced):])


def test_a_rollback_to_the_first_token_under_the_lens_reads_the_prompt_again(tiny_lm):
    """The lens leaves the prompt's last token to the first step (``deferred``): a rollback to position 0 crops the
    cache back to before it, and the first token's numbers are a fresh pass's again."""
    events = _events(tiny_lm, lens=True, ban_regex=(r"[\s\S]",), ban_max_rollbacks=3, max_new_tokens=4,
                     num_candidates=6)
    live, rollbacks = _timeline(tiny_lm, events)
    assert live == []  # every first token was rolled back, then the limit came
    assert [r.position for r in rollbacks] == [0, 0, 0] and events[-1].stop_reason == "ban_limit"
    prompt_ids = tiny_lm.tokenizer(PROMPT)["input_ids"]
    with torch.no_grad():
        probs = tiny_lm.model(torch.tensor([prompt_ids])).logits[0, -1].float().softmax(-1)
    firsts = [e for e in events if isinstance(e, TokenStep) and e.step == 0]
    assert len(firsts) == 3 and [e.token_id for e in firsts] == [r.forbidden for r in rollbacks]
    for step in firsts:
        for c in step.candidates:
            assert math.isclose(c.raw_prob, float(probs[c.token_id]), rel_tol=1e-4, abs_tol=1e-6)
    assert sorted(int(probs.argsort(descending=True)[i]) for i in range(3)) == sorted(e.token_id for e in firsts)
