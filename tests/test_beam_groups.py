"""Diverse (group) beam search besides its 4.46 reference (tests/test_beam_groups_reference.py): the settings' checks
(form, CLI, a strategy that does not take them), the diversity penalty each candidate records against 4.46's own
per-step group tokens and a forward pass of the test's own, Stop, a saved run, and the tree's fold of the groups.
One decode of a recorded tiny case (GPT-NeoX, 8 beams in 4 groups, D = 0.4, an n-gram ban, 3 returned) serves
most of them. (With a large D a penalised token rarely stays among a group's top candidates at all.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.seeded_models import seeded_lm

from playground.cli import build_parser, main
from playground.cli_options import settings_from_args
from playground.config import BeamSettings, ConfigError, RunSettings
from playground.config.beam_groups import BeamGroupSettings
from playground.engine.strategies import run_strategy
from playground.events import BeamStep, RunFinished
from playground.events.beam_groups import DiverseBeamStep
from playground.models.loaded import LoadedModel
from playground.state.beam_tree import FINISHED, BeamTree
from playground.traces import read_trace, write_trace

RECORD = json.loads((Path(__file__).parent / "data" / "group_beam_4_46.json").read_text())
CASE = next(c for c in RECORD["tiny"] if c["family"] == "gpt_neox")
# Llama, 6 beams in 3 groups, D = 2: every group finishes the same one-token hypothesis (the penalty counts only
# the beams that go on), and the groups end before the length limit.
SAME_ENDS = next(c for c in RECORD["tiny"] if c["family"] == "llama" and c["num_beam_groups"] == 3)
PROMPTS = {"The capital of France is", "Beam search keeps several"}
SIZE = CASE["num_beams"] // CASE["num_beam_groups"]


@pytest.fixture(scope="module")
def lm():
    return seeded_lm(CASE)


def settings(case: dict = CASE, lm: LoadedModel | None = None, **changes) -> RunSettings:
    prompt = next(t for t in PROMPTS if lm is None or lm.tokenizer(t)["input_ids"] == case["prompt_ids"])
    extra = {k: {True: "true", "never": "never"}.get(v, v) if k == "early_stopping" else v
             for k, v in case["settings"].items()}
    values = dict(prompt=prompt, chat=False, strategy="beam", max_new_tokens=case["max_new_tokens"],
                  num_beams=case["num_beams"], num_beam_groups=case["num_beam_groups"],
                  diversity_penalty=case["diversity_penalty"], **extra)
    return RunSettings.from_flat(**{**values, **changes})


@pytest.fixture(scope="module")
def events(lm):
    return list(run_strategy(lm, settings(lm=lm)))


def fold(events) -> BeamTree:
    tree = BeamTree()
    for event in events:
        tree.apply(event)
    return tree


# --- settings ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("values", "message"), [
    ({"num_beams": 4, "num_beam_groups": 3}, "num_beam_groups must divide num_beams: 4 beams do not split into 3 "
                                             "equal groups"),
    ({"num_beams": 4, "diversity_penalty": 1.0}, "diversity_penalty=1 needs num_beam_groups > 1 (the penalty counts "
                                                 "the tokens that earlier groups chose)"),
    ({"num_beam_groups": 2, "diversity_penalty": -0.5}, "diversity_penalty must be in [0, 100] (got -0.5)"),
    ({"num_beam_groups": 17}, "num_beam_groups must be in [1, 16] (got 17)"),
    ({"num_beam_groups": 0}, "num_beam_groups must be in [1, 16] (got 0)"),
])
def test_the_settings_are_refused_with_their_message(values, message):
    with pytest.raises(ConfigError) as error:
        RunSettings.from_flat(strategy="beam", **values).validate()  # what the form's Generate and the CLI call
    assert str(error.value) == message


def test_the_cli_maps_the_flags_and_refuses_groups_that_do_not_divide_the_beams(capsys):
    args = build_parser().parse_args(["trace", "--strategy", "beam", "--num-beams", "6", "--num-beam-groups", "3",
                                      "--diversity-penalty", "0.5"])
    _model, run = settings_from_args(args)
    assert (run.group(BeamSettings).num_beams, run.group(BeamGroupSettings)) == (6, BeamGroupSettings(3, 0.5))
    assert main(["--strategy", "beam", "--num-beams", "4", "--num-beam-groups", "3"]) == 2
    assert "num_beam_groups must divide num_beams" in capsys.readouterr().err


def test_a_strategy_other_than_beam_search_refuses_groups(lm):
    with pytest.raises(ConfigError, match="greedy is not beam search; use beam"):
        run_strategy(lm, RunSettings.from_flat(prompt="Beam search", strategy="greedy", num_beam_groups=2))


# --- the engine's record ---------------------------------------------------------------------------------------
def test_each_candidate_paid_d_times_the_earlier_groups_beams_that_chose_its_token(events):
    """Against 4.46's own tokens of each group at each step (the record), the last step's aside."""
    steps = [e for e in events if isinstance(e, BeamStep)]
    assert all(type(s) is DiverseBeamStep for s in steps)  # read as beam search's steps wherever those are read
    d = CASE["diversity_penalty"]
    paid = 0
    for step, chosen in zip(steps, CASE["beam_tokens"], strict=False):
        for c in step.candidates:
            earlier = chosen[: c.group * SIZE]
            assert c.diversity_penalty == pytest.approx(d * earlier.count(c.token_id)), (step.step, c)
            paid += c.diversity_penalty > 0
        assert {c.group for c in step.candidates} <= set(range(CASE["num_beam_groups"]))
    assert paid > 20  # the penalty bit often in this run


def test_the_first_step_scores_are_the_models_log_probs_less_the_penalty(lm, events):
    """An independent forward pass of the prompt: at the first step every group's running score is 0, so a
    candidate's score is its token's log-prob less the penalty (4.46: the penalty enters the running score; the
    n-gram ban bans nothing at the first step of this prompt)."""
    ids = torch.tensor([CASE["prompt_ids"]])
    with torch.no_grad():
        log_probs = torch.log_softmax(lm.model(ids).logits[0, -1].float(), dim=-1)
    first = next(e for e in events if isinstance(e, BeamStep))
    chosen = CASE["beam_tokens"][0]
    for c in first.candidates:
        expected = float(log_probs[c.token_id]) - CASE["diversity_penalty"] * chosen[: c.group * SIZE].count(c.token_id)
        assert c.score == pytest.approx(expected, abs=1e-5) and c.token_logprob == pytest.approx(expected, abs=1e-5)
    assert any(c.diversity_penalty > 0 for c in first.candidates)


def test_stop_keeps_the_run_with_each_groups_best_so_far(lm):
    polls = iter(range(1000))
    stopped = list(run_strategy(lm, settings(lm=lm, num_return_sequences=3), should_stop=lambda: next(polls) >= 3))
    done = stopped[-1]
    assert isinstance(done, RunFinished) and done.stop_reason == "stopped"
    assert sum(isinstance(e, BeamStep) for e in stopped) == 3
    assert len(done.sequences) == 3 and all(len(s.token_ids) <= 3 for s in done.sequences)
    scores = [s.score for s in done.sequences]
    assert scores == sorted(scores, reverse=True)
    tree = fold(stopped)
    assert tree.best_path and tree.nodes[tree.best_path[-1]].returned_rank == 1
    assert sum(len(hyps) for hyps in tree.group_hypotheses()) >= len(done.sequences)


def test_a_saved_run_reads_back_the_same_and_folds_the_same(events, tmp_path):
    trace = read_trace(write_trace(events, tmp_path / "groups.jsonl"))
    assert trace.events == events
    back, live = fold(trace.events), fold(events)
    assert (back.groups, back.diversity_penalty) == (CASE["num_beam_groups"], CASE["diversity_penalty"])
    assert back.group_hypotheses() == live.group_hypotheses()
    assert [(n.group, n.diversity_penalty) for n in back.nodes] == [(n.group, n.diversity_penalty) for n in live.nodes]


# --- the tree's fold ---------------------------------------------------------------------------------------------
def test_the_tree_ranks_within_a_group_and_stacks_the_groups_in_order(events):
    tree = fold(events)
    nodes = tree.nodes
    for column in tree.columns:
        groups = [nodes[i].group for i in column]  # top to bottom
        assert groups == sorted(groups)
        for g in set(groups):
            ranks = sorted(nodes[i].rank for i in column if nodes[i].group == g)
            assert ranks == list(range(1, len(ranks) + 1))
    returned = {tuple(s.token_ids) for s in events[-1].sequences}
    per_group = tree.group_hypotheses()
    assert len(per_group) == CASE["num_beam_groups"]
    for g, hyps in enumerate(per_group):
        assert all(nodes[h.node_id].group == g for h in hyps)
        assert len([h for h in hyps if nodes[h.node_id].state == FINISHED]) <= SIZE
    # every returned sequence is one of its group's kept hypotheses, with its rank
    kept = {tree.path_tokens(h.node_id): h.run_rank for hyps in per_group for h in hyps}
    assert all(seq in kept for seq in returned)
    assert sorted(r for r in kept.values() if r) == list(range(1, len(returned) + 1))


def test_equal_sequences_that_several_groups_returned_each_keep_their_rank():
    lm = seeded_lm(SAME_ENDS)
    events = list(run_strategy(lm, settings(SAME_ENDS, lm)))
    returned = [tuple(s.token_ids) for s in events[-1].sequences]
    assert len(set(returned)) < len(returned)  # precondition: equal sequences from several groups (4.46's too)
    tree = fold(events)
    ranked = sorted((n.returned_rank, n.group, tree.path_tokens(n.id)) for n in tree.nodes if n.returned_rank)
    assert [r for r, _, _ in ranked] == list(range(1, len(returned) + 1))
    assert [tokens for _, _, tokens in ranked] == returned
    assert len({g for _, g, tokens in ranked if tokens == returned[0]}) == returned.count(returned[0])
    assert tree.nodes[tree.best_path[-1]].returned_rank == 1


def test_with_quant_the_quantized_copy_runs_the_group_search(tiny_lm):
    events = list(run_strategy(tiny_lm, RunSettings.from_flat(strategy="beam", max_new_tokens=3, num_beams=4,
                                                              num_beam_groups=2, diversity_penalty=1.0,
                                                              quant="rtn-int8")))
    kinds = {type(e).__name__ for e in events}
    assert {"QuantReady", "DiverseBeamStep"} <= kinds and "BeamStep" not in kinds


def test_forced_words_and_beam_groups_are_refused_together_and_a_constraint_with_groups_by_name(tiny_lm):
    from playground.config.samplers.grammar import GrammarSettings

    with pytest.raises(ConfigError, match=r"--force-words \(constrained beam search\) does not take beam groups"):
        RunSettings.from_flat(strategy="beam", num_beams=4, num_beam_groups=2, force_words=(" is",)).validate()
    settings = RunSettings.from_flat(strategy="beam", num_beams=4, num_beam_groups=2, max_new_tokens=3)
    with pytest.raises(ConfigError, match=r"diverse beam search \(--num-beam-groups\) does not take a constraint"):
        list(run_strategy(tiny_lm, settings.with_group(GrammarSettings(regex="[a-z ]+"))))
