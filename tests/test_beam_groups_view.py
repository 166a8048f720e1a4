"""The beam tree of a diverse (group) beam search, offscreen: coloured by group with a legend, the diversity penalty
in each candidate's tooltip, each group's hypotheses side by side; and the form's settings refused when the groups
do not divide the beams. Fed one decode of the recorded GPT-NeoX case (8 beams in 4 groups, D = 0.4)."""

from __future__ import annotations

import re

import pytest
from support.seeded_models import seeded_lm
from test_beam_groups import CASE, SIZE, settings

from playground.config import BeamSettings, ConfigError, RunSettings
from playground.config.beam_groups import BeamGroupSettings
from playground.engine.strategies import run_strategy
from playground.events import BeamStep, PrefillDone
from playground.state.beam_tree import PRUNED, SURVIVING
from playground.ui.controls import RunControls
from playground.ui.model_sources import LocalModel
from playground.ui.style import configure_pyqtgraph
from playground.ui.views.beam_tree.items import GROUP_COLORS
from playground.ui.views.beam_tree.panel import BeamTreePanel

GROUPS = CASE["num_beam_groups"]


@pytest.fixture(scope="module")
def lm():
    return seeded_lm(CASE)


@pytest.fixture(scope="module")
def events(lm):
    return list(run_strategy(lm, settings(lm=lm)))


@pytest.fixture
def panel(qtbot, events):
    configure_pyqtgraph()
    widget = BeamTreePanel()
    qtbot.addWidget(widget)
    widget.resize(1200, 800)
    widget.show()
    for event in events:
        if not isinstance(event, PrefillDone):
            widget.apply(event)
    widget.flush()
    return widget


def test_the_tree_is_coloured_by_group_with_a_legend(panel):
    legend = panel.group_legend.text()
    assert panel.group_legend.isVisible()
    for g in range(GROUPS):
        assert f"group {g + 1}" in legend and GROUP_COLORS[g] in legend
    tree = panel.tree
    for chunk in panel._chunks:
        assert not chunk.beam_xy  # every beam edge is drawn in its group's item
        for g, (curve, xy) in chunk.group_edges.items():
            assert curve.opts["pen"].color().name().upper() == GROUP_COLORS[g]
            pairs = list(zip(xy[2::4], xy[3::4], strict=True))  # each segment's child end
            ends = {(n.x, n.y) for n in tree.nodes if n.state != PRUNED and n.group == g and n.parent is not None}
            assert set(pairs) <= ends
    survivor = next(n for n in tree.nodes if n.state == SURVIVING and n.group == 1)
    assert panel._pen(survivor).color().name().upper() == GROUP_COLORS[1]
    assert "in 4 groups (diversity penalty 0.4)" in panel.header.text()
    image = panel.grab().toImage()
    colours = {image.pixelColor(x, y).name().upper() for x in range(0, image.width(), 3)
               for y in range(0, image.height(), 3)}
    assert {GROUP_COLORS[g] for g in range(GROUPS)} <= colours  # the groups' colours are on screen


def test_a_candidates_tooltip_says_its_group_and_the_diversity_penalty_it_paid(panel, events):
    """The penalty against 4.46's tokens of the earlier groups at that step (the record)."""
    tree = panel.tree
    steps = [e for e in events if isinstance(e, BeamStep)]
    penalised = [n for n in tree.nodes if n.diversity_penalty > 0]
    assert penalised
    for node in penalised[:5]:
        chosen = CASE["beam_tokens"][node.step][: node.group * SIZE]
        assert len(steps) > node.step
        tip = panel.tooltip_for(node.id)
        count = chosen.count(node.token_id)
        assert f"beam group {node.group + 1} of {GROUPS}" in tip
        assert f"diversity penalty paid: {CASE['diversity_penalty'] * count:.3f} (= 0.4 × {count} beams" in tip
        assert "before the diversity penalty" in tip


def test_each_groups_hypotheses_are_side_by_side_with_what_the_run_returned(panel, events):
    text = panel.groups_label.text()
    assert panel.groups_label.isVisible()
    assert text.count("<td") == GROUPS and all(f"Group {g + 1}" in text for g in range(GROUPS))
    cells = text.split("<td")[1:]
    tree = panel.tree
    for rank, sequence in enumerate(events[-1].sequences, start=1):
        node = next(n for n in tree.nodes if n.returned_rank == rank)
        assert tree.path_tokens(node.id) == tuple(sequence.token_ids)
        assert f"returned #{rank}" in cells[node.group]  # in its own group's column
        assert f"{sequence.score:.3f}" in cells[node.group]
    assert len(re.findall(r"returned #\d", text)) == len(events[-1].sequences)


def test_a_plain_beam_search_shows_no_groups(qtbot, lm):
    panel = BeamTreePanel()
    qtbot.addWidget(panel)
    for event in run_strategy(lm, settings(num_beam_groups=1, diversity_penalty=0.0, lm=lm, max_new_tokens=4)):
        panel.apply(event)
    panel.flush()
    assert not panel.group_legend.isVisibleTo(panel) and not panel.groups_label.isVisibleTo(panel)
    assert all(not chunk.group_edges for chunk in panel._chunks)


def test_the_forms_settings_are_refused_before_a_run_with_the_message(qtbot, lm):
    """What the window's Generate does with the form (``MainWindow.generate``: the source's check, its message
    in the banner), on the form widget itself."""
    controls = RunControls()
    qtbot.addWidget(controls)
    controls.set_run_settings(RunSettings.from_flat(strategy="beam", num_beams=4, num_beam_groups=3))
    form = controls.run_settings("Beam search")
    assert (form.group(BeamSettings).num_beams, form.group(BeamGroupSettings).num_beam_groups) == (4, 3)
    assert controls.boxes[BeamGroupSettings.name].isEnabled()  # beam search takes the groups: its box is on
    with pytest.raises(ConfigError, match="num_beam_groups must divide num_beams: 4 beams do not split into 3"):
        LocalModel(lm).check(form)
    controls.set_run_settings(RunSettings.from_flat(strategy="greedy"))
    assert not controls.boxes[BeamGroupSettings.name].isEnabled()
