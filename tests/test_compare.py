"""Side-by-side runs: each pane decodes as its strategy alone would, panes advance together, figures are exact."""

from __future__ import annotations

import math

import pytest
import torch

from playground.config import CompareSettings, ConfigError, RunSettings
from playground.engine.compare.likelihood import log_likelihood
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, RunStarted, TokenStep, dumps_event, event_from_dict
from playground.events.figures import distinct_n, first_divergence, repeated_ngrams
from playground.events.panes import PaneFinished, PaneStarted, PaneToken


def compare_settings(*panes: str, **shared) -> RunSettings:
    return RunSettings(strategy="compare", prompt=shared.pop("prompt", "Hello there"), max_new_tokens=8,
                       **shared, groups=(CompareSettings(panes=panes),))


def reference_greedy(lm, prompt_ids, n):
    out = lm.model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(prompt_ids):].tolist()


def reference_beam(lm, prompt_ids, n, beams):
    out = lm.model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, num_beams=beams, do_sample=False,
                            min_new_tokens=n, early_stopping=True)
    return out[0, len(prompt_ids):].tolist()


def test_each_pane_decodes_as_its_strategy_does_alone(tiny_lm):
    events = list(run_strategy(tiny_lm, compare_settings("greedy", "sample --temperature 0.9 --seed 7",
                                                         "beam --num-beams 3")))
    start = events[0]
    assert isinstance(start, RunStarted) and start.strategy == "compare"
    assert start.settings["compare"]["panes"] == ["greedy", "sample --temperature 0.9 --seed 7",
                                                  "beam --num-beams 3"]
    assert [e.label for e in events if isinstance(e, PaneStarted)] == list(start.settings["compare"]["panes"])
    done = {e.pane: e for e in events if isinstance(e, PaneFinished)}
    prompt = list(start.prompt_token_ids)
    assert list(done[0].token_ids) == reference_greedy(tiny_lm, prompt, 8)
    assert list(done[2].token_ids) == reference_beam(tiny_lm, prompt, 8, 3)
    # The sampled pane equals the same sampling run made alone (same seed, same draws).
    alone = list(run_strategy(tiny_lm, RunSettings(strategy="sample", prompt="Hello there", max_new_tokens=8,
                                                   temperature=0.9, seed=7)))
    assert done[1].token_ids == alone[-1].token_ids
    assert [e.token_id for e in events if isinstance(e, PaneToken) and e.pane == 1] == list(alone[-1].token_ids)
    # Pane 0's own events are the run's: its tokens view shows pane 0.
    assert [e.token_id for e in events if isinstance(e, TokenStep)] == list(done[0].token_ids)
    assert isinstance(events[-1], RunFinished) and events[-1].token_ids == done[0].token_ids


def test_panes_advance_one_token_each_in_turn(tiny_lm):
    events = list(run_strategy(tiny_lm, compare_settings("greedy", "sample --seed 1")))
    order = [(e.pane, e.step) for e in events if isinstance(e, PaneToken)]
    assert order == [(pane, step) for step in range(8) for pane in (0, 1)]


def test_figures_are_exact(tiny_lm):
    assert distinct_n([1, 2, 1, 2, 3], 1) == 3 / 5 and distinct_n([1, 2, 1, 2, 3], 2) == 3 / 4
    assert repeated_ngrams([5, 6, 7, 5, 6, 7, 5], 3) == 2  # (5,6,7) again, (6,7,5) again
    assert first_divergence([1, 2, 3], [1, 2, 3]) == -1
    assert first_divergence([1, 2, 4], [1, 2, 3]) == 2 and first_divergence([1, 2], [1, 2, 3]) == 2
    # Log-likelihood against a token-by-token computation without a cache.
    prompt, ids = [3, 17, 42], [7, 99, 12, 5]
    expected = 0.0
    with torch.inference_mode():
        for i, token in enumerate(ids):
            logits = tiny_lm.model(torch.tensor([prompt + ids[:i]])).logits[0, -1].double()
            expected += float(torch.log_softmax(logits, -1)[token])
    assert math.isclose(log_likelihood(tiny_lm, prompt, ids), expected, rel_tol=1e-4)
    events = list(run_strategy(tiny_lm, compare_settings("greedy", "sample --seed 3")))
    start = events[0]
    for done in (e for e in events if isinstance(e, PaneFinished)):
        ids = list(done.token_ids)
        assert done.figures["tokens"] == len(ids) and done.figures["distinct_2"] == distinct_n(ids, 2)
        assert math.isclose(done.figures["log_likelihood"],
                            log_likelihood(tiny_lm, list(start.prompt_token_ids), ids), rel_tol=1e-5)


@pytest.mark.parametrize(("panes", "message"), [
    (("greedy",), "2 to 4 panes, not 1"),
    (("greedy",) * 5, "2 to 4 panes, not 5"),
    (("greedy", "nucleus"), "pane 'nucleus': argument --strategy: invalid choice"),
    (("greedy", "sample --temperature 0"), "pane 'sample --temperature 0': temperature must be above 0"),
    (("greedy", "greedy --model other"), "panes share the loaded model"),
    (("greedy", "compare"), "a pane cannot itself be a side-by-side run"),
    (("greedy", "sample --bogus 2"), "unrecognized arguments: --bogus 2"),
])
def test_bad_panes_are_refused_before_the_first_event(tiny_lm, panes, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_strategy(tiny_lm, compare_settings(*panes))


def test_a_pane_refuses_every_model_option_of_the_command_line():
    """The pane parser lives in config, below the command line, so it lists the model options itself: it must list
    exactly the command line's (model, server, preset), and refuse an abbreviation of one as well."""
    import argparse

    from playground.cli_options import add_run_options
    from playground.config.words import PANE_MODEL_FLAGS, settings_from_pane

    parser = argparse.ArgumentParser()
    add_run_options(parser)
    (model,) = [g for g in parser._action_groups if g.title == "model"]
    flags = {flag for action in model._group_actions for flag in action.option_strings}
    assert set(PANE_MODEL_FLAGS) == flags | {"--preset"}
    for words in ("greedy --dev cpu", "greedy --remote-m other", "greedy --base-url=http://x"):
        with pytest.raises(ConfigError, match=f"pane {words!r}: panes share the loaded model, so --"):
            settings_from_pane(RunSettings(), words)


def test_stop_ends_every_pane(tiny_lm):
    polls = []

    def stop_after_three_polls() -> bool:
        polls.append(1)
        return len(polls) > 6

    events = list(run_strategy(tiny_lm, compare_settings("greedy", "sample --seed 2"), stop_after_three_polls))
    done = [e for e in events if isinstance(e, PaneFinished)]
    assert [d.stop_reason for d in done] == ["stopped", "stopped"]
    assert events[-1].stop_reason == "stopped" and len(done[0].token_ids) < 8


def test_events_survive_a_trace_round_trip(tiny_lm):
    import json

    events = list(run_strategy(tiny_lm, compare_settings("greedy", "beam --num-beams 2")))
    assert [event_from_dict(json.loads(dumps_event(e))) for e in events] == events


def test_a_pane_that_ends_first_leaves_the_others_running_in_inference_mode(tiny_lm):
    """Beam search ends (and leaves its inference-mode block) while a sampling pane is mid-run: the sampling pane's
    next step must still run without autograd (this failed with 'Inference tensors cannot be saved for backward')."""
    settings = compare_settings("beam --num-beams 2 --max-new-tokens 2", "sample --seed 1", "greedy")
    events = list(run_strategy(tiny_lm, settings))
    done = [e for e in events if isinstance(e, PaneFinished)]
    assert [len(d.token_ids) for d in done] == [2, 8, 8]
    assert not torch.is_inference_mode_enabled()
