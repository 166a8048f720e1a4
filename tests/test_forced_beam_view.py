"""Constrained beam search (``--force-words``) as a user sees it: the banks it keeps, the beams it finishes, the
beam tree's marks, tooltips and bank table, a saved run and Stop. One decode of a tiny model (module-scoped) feeds
most asserts; the references are computed here from the token ids (which words a path holds) and from the dealing
rule written out by hand."""

from __future__ import annotations

import pytest

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import BeamStep, RunFinished
from playground.events.beam_forced import BeamBanks, ForcedWordsDone, ForcedWordsStarted
from playground.traces import read_trace, write_trace

WORDS = (" is", " or| li")  # " is" is where beams go anyway: met early, so beams finish


def settings(**extra) -> RunSettings:
    return RunSettings.from_flat(prompt="The capital", chat=False, strategy="beam", num_beams=3, max_new_tokens=20,
                                 num_return_sequences=2, force_words=WORDS, **extra)


@pytest.fixture(scope="module")
def lm(tiny_lm_eos):
    return tiny_lm_eos


@pytest.fixture(scope="module")
def events(lm):
    return list(run_strategy(lm, settings()))


def word_ids(lm) -> list[list[tuple[int, ...]]]:
    return [[tuple(lm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in w.split("|")] for w in WORDS]


def holds(ids: list[int], alternatives: list[tuple[int, ...]]) -> bool:
    return any(tuple(ids[i : i + len(a)]) == a for a in alternatives for i in range(len(ids) - len(a) + 1))


def paths(events) -> list[list[tuple[int, list[int]]]]:
    """For each step: each candidate's (parent beam, tokens generated so far on its path, its own last)."""
    beams: list[list[int]] = [[]]
    out = []
    for step in (e for e in events if isinstance(e, BeamStep)):
        out.append([(c.beam, [*beams[c.beam], c.token_id]) for c in step.candidates])
        by = {(c.beam, c.token_id): [*beams[c.beam], c.token_id] for c in step.candidates if c.survived}
        beams = [by[(p, t)] for p, t in zip(step.parents, step.token_ids, strict=True)]
    return out


def test_each_candidates_words_are_the_ones_its_path_holds(lm, events):
    prompt = list(events[0].prompt_token_ids)
    banks = [e for e in events if isinstance(e, BeamBanks)]
    words = word_ids(lm)
    eos = set(lm.eos_token_ids)
    for step, rows in zip(banks, paths(events), strict=True):
        assert len(step.candidates) == len(rows)
        for info, (_parent, path) in zip(step.candidates, rows, strict=True):
            seq = prompt + [t for t in path if t not in eos]
            assert set(info.met) == {i for i, w in enumerate(words) if holds(seq, w)}


def test_the_next_beams_are_dealt_by_bank_best_bank_first(events):
    """By hand: the sorted candidates by (bank, score), then the best of each bank, the second of each, ..."""
    dealt_steps = 0
    for banks, step in zip([e for e in events if isinstance(e, BeamBanks)],
                           [e for e in events if isinstance(e, BeamStep)], strict=True):
        pool = [(b.bank, c.score, (c.beam, c.token_id)) for b, c in zip(banks.candidates, step.candidates,
                                                                       strict=True) if b.sorted]
        if not any(b.proposed for b in banks.candidates):
            continue  # 4.46 deals only when a word proposed something
        dealt_steps += 1
        pool.sort(key=lambda r: (-r[0], -r[1]))
        seen: dict[int, int] = {}
        rounds = []
        for bank, score, key in pool:
            rounds.append((seen.get(bank, 0), -bank, -score, key))
            seen[bank] = seen.get(bank, 0) + 1
        expected = [key for *_, key in sorted(rounds)[: len(step.parents)]]
        assert list(zip(step.parents, step.token_ids, strict=True)) == expected
        bank_of = {key: bank for bank, _score, key in pool}
        assert banks.survivor_banks == tuple(bank_of[key] for key in expected)
    assert dealt_steps >= 3


def test_a_beam_finishes_only_once_it_met_every_word(lm, events):
    prompt, words, eos = list(events[0].prompt_token_ids), word_ids(lm), set(lm.eos_token_ids)
    refused = finished = 0
    for step, rows in zip([e for e in events if isinstance(e, BeamStep)], paths(events), strict=True):
        for rank, (c, (_p, path)) in enumerate(zip(step.candidates, rows, strict=True)):
            if c.token_id not in eos or rank >= len(step.parents):
                continue
            met_all = all(holds(prompt + path[:-1], w) for w in words)
            if c.finished:  # (a beam that met them may still be turned away by a full set of better ones)
                assert met_all
            finished += c.finished
            refused += not met_all
    assert finished and refused  # both happened in this run
    done = next(e for e in events if isinstance(e, ForcedWordsDone))
    final = events[-1]
    assert isinstance(final, RunFinished) and len(final.sequences) == 2
    for seq, met in zip(final.sequences, done.met, strict=True):
        assert met == (0, 1) and all(holds(prompt + list(seq.token_ids), w) for w in words)


def test_a_saved_run_reads_back_whole(events, tmp_path):
    assert sum(isinstance(e, ForcedWordsStarted) for e in events) == 1
    trace = read_trace(write_trace(events, tmp_path / "forced.jsonl"))
    assert trace.events == events and not trace.skipped


def test_stop_keeps_the_run_and_what_it_met(lm):
    polls = iter(range(1000))
    stopped = list(run_strategy(lm, settings(), should_stop=lambda: next(polls) >= 4))
    final = stopped[-1]
    assert isinstance(final, RunFinished) and final.stop_reason == "stopped"
    assert final.sequences and any(isinstance(e, ForcedWordsDone) for e in stopped)
    assert 0 < sum(isinstance(e, BeamStep) for e in stopped) < 20


def test_the_tree_marks_where_each_word_is_placed(qtbot, lm, events, tmp_path):
    from PySide6.QtGui import QColor

    from playground.ui.views.beam_tree.forced import MARK_COLOR
    from playground.ui.views.beam_tree.panel import BeamTreePanel

    panel = BeamTreePanel()
    qtbot.addWidget(panel)
    panel.resize(1100, 700)
    panel.show()
    for event in events:
        panel.apply(event)
    panel.flush()
    prompt, words, eos = list(events[0].prompt_token_ids), word_ids(lm), set(lm.eos_token_ids)
    tree, forced = panel.tree, panel.forced
    stars = set()
    for node in tree.nodes[1:]:
        info = forced.progress.candidate(node.step, node.rank)
        path = [t for t in tree.path_tokens(node.id) if t not in eos]
        completes = any(holds(prompt + path, w) and not holds(prompt + path[:-1], w) for w in words)
        if info is not None and info.sorted and completes:
            stars.add((node.x, node.y))
        if completes:
            assert "forced words met" in panel.tooltip_for(node.id)
    marked = {(p.pos().x(), p.pos().y()) for p in forced.marks.points() if p.symbol() == "star"}
    assert marked == stars and stars
    text = forced.label.text()
    assert forced.label.isVisible() and "Forced words" in text and "all met" in text and "any one of 2" in text
    image = panel.grab().toImage()  # painted, not blank: many colours, the marks' gold among them
    colours = {image.pixel(x, y) for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)}
    assert len(colours) > 20
    assert any(abs(QColor(c).hue() - QColor(MARK_COLOR).hue()) < 4 and QColor(c).saturation() > 120 for c in colours)
    again = BeamTreePanel()  # from the saved run: the same panel
    qtbot.addWidget(again)
    for event in read_trace(write_trace(events, tmp_path / "forced.jsonl")).events:
        again.apply(event)
    again.flush()
    assert again.forced.label.text() == text and len(again.forced.marks.points()) == len(forced.marks.points())
    again.apply(events[0])  # a new run empties the layer
    assert not again.forced.label.isVisible() and len(again.forced.marks.points()) == 0


def test_the_window_runs_forced_words_from_its_form_and_every_view_copes(qtbot, tmp_path, lm):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication
    from test_view_edges import DEFAULT_SIZE, edge_problems
    from windows import open_window

    w = open_window(qtbot, tmp_path, lm, settings(), size=DEFAULT_SIZE)
    w.set_run_settings(settings())
    assert w.current_settings() == settings()  # the form keeps " or| li" as one word, its spaces too
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=20000)
    run = w.session.selected
    assert run is not None and run.error is None and run.finished is not None
    for name, dock in w.docks.items():  # every view shows the run or says why it has nothing for it
        dock.show()
        dock.raise_()
        QApplication.processEvents()
        assert w.views[name].isVisible() or dock.pages.currentWidget() is dock.empty, name
    w.docks["beam"].raise_()
    for _ in range(5):
        QApplication.processEvents()
    view = w.views["beam"]
    view.grab()
    assert view.panel.forced.label.isVisible()
    problems = edge_problems("beam", view, allow_scroll=False)
    assert not problems, "\n".join(str(p) for p in problems)
