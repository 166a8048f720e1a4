"""The Qt-free beam tree: nodes, layout, best path and length-penalty re-ranking from recorded events."""

from __future__ import annotations

import subprocess
import sys

import pytest

from playground.config import RunSettings
from playground.engine.beam import run_beam_search
from playground.engine.strategies import run_strategy
from playground.events import BeamStep, RunFinished
from playground.state.beam_tree import FINISHED, PRUNED, ROOT, SURVIVING, BeamTree


def assert_reproduces_run(tree, ranked, sequences, tol: float) -> None:
    """The re-ranked hypotheses start with the run's returned sequences, in its order, with its scores."""
    top = ranked[: len(sequences)]
    assert [h.run_rank for h in top] == list(range(1, len(sequences) + 1))
    for hyp, seq in zip(top, sequences, strict=True):
        assert hyp.score == pytest.approx(seq.score, abs=tol)
        assert hyp.sum_logprobs == pytest.approx(seq.sum_logprobs, abs=tol)
        assert hyp.length == len(seq.token_ids)
        assert tree.path_tokens(hyp.node_id) == seq.token_ids


@pytest.fixture(scope="module")
def eos_run(tiny_lm_eos):
    settings = RunSettings.from_flat(strategy="beam", prompt="The weather in Paris", num_beams=4, max_new_tokens=24,
                           early_stopping="never", length_penalty=1.0, num_return_sequences=3)
    return list(run_beam_search(tiny_lm_eos, settings))


@pytest.fixture(scope="module")
def long_run(tiny_lm):
    settings = RunSettings.from_flat(strategy="beam", prompt="Beam search keeps", num_beams=16, max_new_tokens=64)
    return list(run_beam_search(tiny_lm, settings))


def stopped_run(lm, polls_before_stop: int, **overrides):
    """A real run stopped by ``should_stop`` (as the Stop button does) before its ``polls_before_stop``+1-th step."""
    polls = iter(range(1000))
    settings = RunSettings.from_flat(strategy="beam", **{
        "prompt": "The weather in Paris", "num_beams": 4, "max_new_tokens": 40, "num_return_sequences": 3,
        "early_stopping": "never", **overrides})
    return list(run_strategy(lm, settings, should_stop=lambda: next(polls) >= polls_before_stop))


def fold(events) -> BeamTree:
    tree = BeamTree()
    for event in events:
        tree.apply(event)
    return tree


def test_nodes_mirror_the_candidates(eos_run):
    tree = fold(eos_run)
    steps = [e for e in eos_run if isinstance(e, BeamStep)]
    assert tree.steps == len(steps)
    assert len(tree.nodes) == 1 + sum(len(e.candidates) for e in steps)
    assert tree.nodes[0].state == ROOT
    assert tree.count(SURVIVING) == sum(len(e.parents) for e in steps)
    assert tree.count(FINISHED) == sum(c.finished for e in steps for c in e.candidates)
    assert tree.count(PRUNED) == len(tree.nodes) - 1 - tree.count(SURVIVING) - tree.count(FINISHED)
    assert tree.count(FINISHED) > 0
    for node in tree.nodes[1:]:
        parent = tree.nodes[node.parent]
        assert parent.step == node.step - 1
        assert parent.state in (SURVIVING, ROOT)  # only running beams have children
        assert node.x == node.step
        assert 0 < node.prob <= 1


def test_paths_reproduce_cumulative_scores(eos_run):
    tree = fold(eos_run)
    for node in tree.nodes[1:]:
        total = sum(tree.nodes[i].token_logprob for i in tree.path(node.id)[1:])
        assert total == pytest.approx(node.cum_logprob, abs=1e-4)


def test_best_path_is_the_best_returned_sequence(eos_run):
    tree = fold(eos_run)
    done = eos_run[-1]
    assert isinstance(done, RunFinished)
    assert tree.best_path[0] == 0
    best = tree.nodes[tree.best_path[-1]]
    assert best.state == FINISHED and best.returned_rank == 1
    assert tree.path_tokens(best.id) == done.token_ids
    assert best.finished_score == pytest.approx(done.sequences[0].score)
    ranks = sorted(n.returned_rank for n in tree.nodes if n.returned_rank is not None)
    assert ranks == list(range(1, len(done.sequences) + 1))


def test_rerank_with_the_runs_penalty_reproduces_the_run(eos_run):
    tree = fold(eos_run)
    done = eos_run[-1]
    ranked = tree.rerank(tree.length_penalty)
    assert_reproduces_run(tree, ranked, done.sequences, tol=1e-5)


def test_rerank_recomputes_scores_without_regenerating(eos_run):
    tree = fold(eos_run)
    before = len(tree.nodes)
    for penalty in (-1.0, 0.0, 0.5, 2.0):
        ranked = tree.rerank(penalty)
        assert len(ranked) == tree.count(FINISHED)
        assert [h.score for h in ranked] == sorted((h.score for h in ranked), reverse=True)
        for h in ranked:
            assert h.score == pytest.approx(h.sum_logprobs / h.length**penalty)
    assert len(tree.nodes) == before
    # A strong positive penalty favours longer hypotheses: the best one is at least as long as with 0.
    assert tree.rerank(3.0)[0].length >= tree.rerank(0.0)[0].length
    # With length_penalty = 0 the ranking is by raw sum of log-probs.
    assert tree.rerank(0.0)[0].sum_logprobs == max(h.sum_logprobs for h in tree.rerank(0.0))


def test_layout_has_no_crossing_edges_and_no_overlaps(long_run):
    tree = fold(long_run)
    assert tree.steps == 64 and tree.width == 16
    for column in tree.columns:
        ys = [tree.nodes[i].y for i in column]
        assert ys == sorted(ys) and len(set(ys)) == len(ys)  # top to bottom, no two nodes at one place
        parent_ys = [tree.nodes[tree.nodes[i].parent].y for i in column]
        assert parent_ys == sorted(parent_ys)  # children keep their parents' order: no crossings
        assert max(ys) < 2 * len(column)  # compact: bounded height per column
    best = tree.nodes[tree.best_path[-1]]
    assert best.step == 63 and best.returned_rank == 1


def test_kv_cost_per_beam(long_run):
    tree = fold(long_run)
    last = [e for e in long_run if isinstance(e, BeamStep) and e.parents][-1]
    assert tree.kv_cache_bytes in (last.kv_cache_bytes, long_run[-2].kv_cache_bytes)
    assert tree.kv_bytes_per_beam == tree.kv_cache_bytes / 16


def test_stopped_run_marks_the_best_running_beam(tiny_lm):
    polls = iter(range(100))
    settings = RunSettings.from_flat(strategy="beam", prompt="Beam search keeps", num_beams=3, max_new_tokens=20)
    events = list(run_beam_search(tiny_lm, settings, lambda: next(polls) >= 4))
    tree = fold(events)
    assert tree.stop_reason == "stopped" and tree.steps == 4
    assert tree.path_tokens(tree.best_path[-1]) == events[-1].token_ids


def test_stopped_run_reranks_what_it_returned(tiny_lm_eos):
    """A stopped run returns running beams scored as if they ended there: re-ranking at the run's own penalty must
    give the run's result, not the best of the finished hypotheses alone."""
    events = stopped_run(tiny_lm_eos, 3, length_penalty=2.0)
    done = events[-1]
    assert isinstance(done, RunFinished) and done.stop_reason == "stopped"
    tree = fold(events)
    best = tree.nodes[tree.best_path[-1]]
    assert best.state == SURVIVING and tree.count(FINISHED) > 0  # the case that went wrong: best is a running beam
    finished_only = max(tree.finished_nodes(), key=lambda n: n.normalised_score(tree.length_penalty))
    assert finished_only.returned_rank != 1  # ranking the finished hypotheses alone would pick another one
    assert {tree.nodes[i].state for i in tree.returned_running} == {SURVIVING}
    assert best.id in tree.returned_running and best.finished_score == pytest.approx(done.sequences[0].score)
    ranked = tree.rerank(tree.length_penalty)
    assert len(ranked) == tree.count(FINISHED) + len(tree.returned_running)
    assert_reproduces_run(tree, ranked, done.sequences, tol=1e-4)
    for h in tree.rerank(0.5):  # other penalties re-score the same pool
        assert h.score == pytest.approx(h.sum_logprobs / h.length**0.5)


def test_stopped_run_without_finished_hypotheses_reranks_its_beams(tiny_lm):
    events = stopped_run(tiny_lm, 5, prompt="Beam search keeps")
    tree = fold(events)
    assert tree.stop_reason == "stopped" and tree.count(FINISHED) == 0
    ranked = tree.rerank(tree.length_penalty)
    assert [h.run_rank for h in ranked] == [1, 2, 3]
    assert [h.score for h in ranked] == pytest.approx([s.score for s in events[-1].sequences], abs=1e-4)


def test_end_without_run_finished(eos_run):
    tree = fold(eos_run[:-1])
    assert not tree.ended
    tree.end("failed")
    assert tree.ended and tree.ended_status == "failed" and tree.stop_reason is None
    assert tree.best_path == [] and len(tree.rerank(1.0)) == tree.count(FINISHED)
    done = fold(eos_run)
    done.end("failed")  # RunFinished came: nothing changes
    assert done.ended_status is None and done.stop_reason == eos_run[-1].stop_reason


def test_counts_are_kept_as_the_tree_grows(eos_run):
    tree = BeamTree()
    for event in eos_run:
        tree.apply(event)
        for state in (ROOT, SURVIVING, PRUNED, FINISHED):
            assert tree.count(state) == sum(n.state == state for n in tree.nodes)
        assert [n.id for n in tree.finished_nodes()] == [n.id for n in tree.nodes if n.state == FINISHED]


def test_reset_and_refold_give_the_same_tree(eos_run):
    tree = fold(eos_run)
    snapshot = [(n.id, n.parent, n.y, n.state) for n in tree.nodes]
    tree.reset()
    assert tree.nodes == [] and tree.steps == 0 and tree.best_path == []
    for event in eos_run:
        tree.apply(event)
    assert [(n.id, n.parent, n.y, n.state) for n in tree.nodes] == snapshot


def test_module_loads_neither_qt_nor_torch():
    code = ("import sys, playground.state.beam_tree; "
            "print(sorted(m for m in ('PySide6', 'pyqtgraph', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
