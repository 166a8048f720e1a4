"""Tree speculation in the speculative view and its Qt-free state, on real tree runs of a tiny model.

Each figure is recomputed here from the rounds' parents and ranks (depths walked from the parents here, the cut
trees' paths and sizes counted here), not read back from the state's own helpers.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from PySide6.QtCore import QPointF, QSize, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QApplication, QScrollArea
from windows import open_window

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, TokenStep, dumps_event, event_from_dict
from playground.events.speculative import DraftToken, SpeculativeRound, SpeculativeStarted
from playground.state import Run, visible_token_text
from playground.state.speculative import ACCEPTED, REJECTED, TARGET, SpeculativeState
from playground.ui.style import configure_pyqtgraph, format_percent
from playground.ui.views.speculative import SpeculativeView
from playground.ui.views.speculative.text import ACCEPTED_COLOR, REJECTED_COLOR, TARGET_COLOR
from playground.ui.views.speculative.tree import NODE_COLORS, UNREACHED

PROMPT = "Speculative decoding drafts tokens and verifies them. Beam search keeps several hypotheses"


def tree_settings(**options) -> RunSettings:
    values = dict(prompt=PROMPT, chat=False, max_new_tokens=30, strategy="speculative", draft="layers",
                  draft_layers=2, draft_k=4, tree_width=3, baseline_tokens=8)
    values.update(options)
    return RunSettings.from_flat(**values)


@pytest.fixture(scope="module")
def tree_lm():
    from support.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=3, layers=4, family="llama")


@pytest.fixture(scope="module")
def greedy_tree(tree_lm) -> list:
    """The target's first layer drafts its 3 likeliest paths depth by depth, 5 deep, verified greedily."""
    return list(run_strategy(tree_lm, tree_settings(draft_layers=1, draft_k=5)))


@pytest.fixture(scope="module")
def sampled_tree(tree_lm) -> list:
    return list(run_strategy(tree_lm, tree_settings(do_sample=True, temperature=0.8, baseline_tokens=0, seed=1)))


def rounds_of(events: list) -> list[SpeculativeRound]:
    return [e for e in events if isinstance(e, SpeculativeRound)]


def folded(events: list) -> SpeculativeState:
    state = SpeculativeState()
    for event in events:
        state.apply(event)
    return state


def parents_of(r: SpeculativeRound) -> list[int]:
    return list(r.parents) if r.parents else list(range(-1, len(r.drafted) - 1))


def depths_walked(r: SpeculativeRound) -> list[int]:
    """Each node's depth, counting the steps up its parents to the context."""
    parents = parents_of(r)
    out = []
    for i in range(len(r.drafted)):
        depth, node = 0, parents[i]
        while node >= 0:
            depth, node = depth + 1, parents[node]
        out.append(depth)
    return out


def turned_down(r: SpeculativeRound) -> list[int]:
    """The children of the accepted path's last node (of the context when none was accepted), by rank."""
    last = r.accepted - 1
    return sorted((i for i, parent in enumerate(parents_of(r)) if parent == last), key=lambda i: r.drafted[i].rank)


@pytest.mark.parametrize("fixture", ["greedy_tree", "sampled_tree"])
def test_the_runs_hold_what_the_tree_view_must_show(fixture, request):
    rounds = rounds_of(request.getfixturevalue(fixture))
    assert all(r.is_tree for r in rounds if r.drafted)  # (a last round with room for one token drafts nothing)
    for r in rounds:  # the accepted path comes first: a chain from the context
        assert [d.accepted for d in r.drafted] == [i < r.accepted for i in range(len(r.drafted))]
        assert parents_of(r)[: r.accepted] == list(range(-1, r.accepted - 1))
    assert any(r.accepted and turned_down(r) for r in rounds)  # a path that stopped where alternatives were
    assert any(len(turned_down(r)) < len(r.drafted) - r.accepted for r in rounds)  # and nodes never reached
    assert any(d.rank > 0 for r in rounds for d in r.drafted[: r.accepted])  # a path through a second choice


@pytest.mark.parametrize("fixture", ["greedy_tree", "sampled_tree"])
def test_a_tree_rounds_rejected_marks_are_the_alternatives_where_its_path_stopped(fixture, request):
    events = request.getfixturevalue(fixture)
    state = folded(events)
    text_of = {e.step: e.text for e in events if isinstance(e, TokenStep)}
    expected = []
    for r in rounds_of(events):
        expected += [(ACCEPTED, text_of[r.first_step + i]) for i in range(r.accepted)]
        expected += [(REJECTED, r.drafted[i].text) for i in turned_down(r)]
        if r.target_kind != "none":
            expected.append((TARGET, text_of[r.first_step + r.accepted]))
    assert [(m.kind, m.text) for m in state.marks] == expected
    # Far fewer than every node off the path: the branches the target never reached are not in the text.
    assert sum(m.kind == REJECTED for m in state.marks) < state.rejected


def test_the_turned_down_alternatives_read_in_the_drafters_rank_order():
    """A hand-made round whose drafter listed the alternatives after the path's last node out of rank order (a
    sampled verification tries them in its own order): the text shows them by rank, as the drafter ranked them."""

    def node(text: str, rank: int, accepted: bool = False) -> DraftToken:
        return DraftToken(token_id=len(text), text=text, draft_prob=0.5, target_prob=0.25, accepted=accepted,
                          draw=None, rank=rank)

    drafted = (node("a", 0, True), node("x", 2), node("y", 0), node("z", 1), node("w", 1))
    r = SpeculativeRound(round=0, first_step=0, emitted=2, drafted=drafted, accepted=1, target_token_id=9,
                         target_text="t", target_kind="correction", target_prob=0.5, draft_ms=1.0, verify_ms=2.0,
                         kv_cache_bytes=0, parents=(-1, 0, 0, 0, -1))
    state = SpeculativeState()
    state.apply(SpeculativeStarted(drafter="suffix", detail="", draft_k=2, do_sample=False, baseline_tokens=0,
                                   tree_width=3, tree_nodes=8))
    state.apply(r)
    expected = [(ACCEPTED, "a")] + [(REJECTED, drafted[i].text) for i in turned_down(r)] + [(TARGET, "t")]
    assert expected == [(ACCEPTED, "a"), (REJECTED, "y"), (REJECTED, "z"), (REJECTED, "x"), (TARGET, "t")]
    assert [(m.kind, m.text) for m in state.marks] == expected


@pytest.mark.parametrize("fixture", ["greedy_tree", "sampled_tree"])
def test_acceptance_is_counted_by_depth(fixture, request):
    events = request.getfixturevalue(fixture)
    state = folded(events)
    rounds = rounds_of(events)
    levels = [max(depths_walked(r), default=-1) + 1 for r in rounds]
    assert [r.depths() for r in rounds] == [depths_walked(r) for r in rounds]
    deepest = max(levels)
    drafted_at = [sum(1 for n in levels if n > d) for d in range(deepest)]
    reached_at = [sum(1 for n, r in zip(levels, rounds, strict=True) if n > d and r.accepted >= d)
                  for d in range(deepest)]
    accepted_at = [sum(1 for r in rounds if r.accepted > d) for d in range(deepest)]
    assert (state.drafted_at, state.reached_at, state.accepted_at) == (drafted_at, reached_at, accepted_at)
    assert state.position_rates() == [a / n if n else None for a, n in zip(accepted_at, reached_at, strict=True)]
    examined = sum(min(n, r.accepted + 1) for n, r in zip(levels, rounds, strict=True))
    assert state.examined == examined == sum(reached_at)
    assert state.alpha == pytest.approx(sum(r.accepted for r in rounds) / examined)
    assert state.drafted == sum(len(r.drafted) for r in rounds)  # nodes, as the engine counts them
    assert state.acceptance_rate == pytest.approx(events[-1].figures["acceptance_rate"])


def cut_counts(r: SpeculativeRound, depth: int, width: int) -> tuple[int, int]:
    """(accepted tokens, nodes) of ``r`` had its tree kept only nodes of depth < ``depth`` with rank < ``width``
    whose parents were kept: walk the path down while its nodes are kept; count the kept nodes."""
    parents, depths = parents_of(r), depths_walked(r)
    kept = []
    for i, d in enumerate(r.drafted):
        kept.append(depths[i] < depth and d.rank < width and (parents[i] < 0 or kept[parents[i]]))
    path = 0
    while path < r.accepted and kept[path]:
        path += 1
    return path, sum(kept)


def verify_line(rounds: list[SpeculativeRound]) -> tuple[float, float]:
    """c_verify(n) = a + b·n, least squares over the rounds that did not also read the prompt (b ≥ 0)."""
    x = np.array([len(r.drafted) for r in rounds if not r.prompt_read], dtype=float)
    y = np.array([r.verify_ms for r in rounds if not r.prompt_read])
    if np.ptp(x) == 0:
        return float(y.mean()), 0.0
    slope, intercept = np.polyfit(x, y, 1)
    if slope < 0 or intercept <= 0:
        return float(y.mean()), 0.0
    return float(intercept), float(slope)


def grid_by_hand(events: list) -> tuple[list[list[float]], list[list[float]], list[list[float]]]:
    rounds = rounds_of(events)
    deepest = max(max(depths_walked(r), default=0) for r in rounds) + 1
    widest = max(d.rank for r in rounds for d in r.drafted) + 1
    tokens = [[0.0] * widest for _ in range(deepest)]
    nodes = [[0.0] * widest for _ in range(deepest)]
    for r in rounds:
        for d in range(deepest):
            for w in range(widest):
                path, kept = cut_counts(r, d + 1, w + 1)
                tokens[d][w] += (path + (r.target_kind != "none")) / len(rounds)  # + the target's own, if any
                nodes[d][w] += kept / len(rounds)
    a, b = verify_line(rounds)
    c_draft = sum(r.draft_ms for r in rounds) / sum(len(r.drafted) for r in rounds)
    baseline = events[-1].figures.get("baseline_tokens_per_s")
    plain_ms = 1000.0 / baseline if baseline else a
    speedups = [[t * plain_ms / (n * c_draft + a + b * n) for t, n in zip(trow, nrow, strict=True)]
                for trow, nrow in zip(tokens, nodes, strict=True)]
    return tokens, nodes, speedups


def test_the_tree_what_ifs_costs_are_the_rounds_own(greedy_tree):
    """The costs the speed-ups rest on, from the rounds here: draft ms per node, the verify line, plain ms per token
    (the measured baseline), the number of rounds."""
    rounds = rounds_of(greedy_tree)
    what_if = folded(greedy_tree).tree_what_if()
    a, b = verify_line(rounds)
    assert what_if.draft_ms == pytest.approx(sum(r.draft_ms for r in rounds) / sum(len(r.drafted) for r in rounds))
    assert (what_if.verify_ms_0, what_if.verify_ms_per_node) == pytest.approx((a, b))
    baseline = greedy_tree[-1].figures["baseline_tokens_per_s"]
    assert what_if.plain_measured and what_if.plain_ms == pytest.approx(1000.0 / baseline)
    assert what_if.rounds == len(rounds)


@pytest.mark.parametrize("fixture", ["greedy_tree", "sampled_tree"])
def test_the_tree_what_if_grid_is_the_cut_trees_recounted(fixture, request):
    events = request.getfixturevalue(fixture)
    state = folded(events)
    what_if = state.tree_what_if()
    tokens, nodes, speedups = grid_by_hand(events)
    assert what_if.depths == tuple(range(1, len(tokens) + 1)) and what_if.widths == tuple(range(1, len(tokens[0]) + 1))
    assert np.allclose(what_if.tokens, tokens) and np.allclose(what_if.nodes, nodes)
    assert np.allclose(what_if.speedups, speedups)
    assert what_if.exact == (fixture == "greedy_tree")
    # The whole tree is this run: its tokens per round and its nodes.
    rounds = rounds_of(events)
    assert what_if.tokens[-1][-1] == pytest.approx(np.mean([r.accepted + (r.target_kind != "none") for r in rounds]))
    assert what_if.nodes[-1][-1] == pytest.approx(np.mean([len(r.drafted) for r in rounds]))
    assert len({round(t, 9) for row in what_if.tokens for t in row}) > 2  # the cuts differ
    # A chain run has no grid.
    assert SpeculativeState().tree_what_if() is None


@pytest.fixture
def view(qtbot) -> SpeculativeView:
    configure_pyqtgraph()
    v = SpeculativeView()
    qtbot.addWidget(v)
    v.resize(1200, 700)
    v.show()
    return v


def shown_tree(view: SpeculativeView) -> list[tuple[str, str, QColor]]:
    """(text, kind, border colour) of every node the round plot shows."""
    tree = view.round_tree
    visible = [label for label in tree.nodes if label.isVisible()]
    assert visible == tree.nodes[: tree.shown]
    return [(label.textItem.toPlainText(), kind, label.border.color())
            for label, kind in zip(visible, tree.kinds, strict=True)]


def short(text: str) -> str:
    text = visible_token_text(text)
    return (text if len(text) <= 9 else text[:8] + "…") or "∅"


def edge_pairs(item) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    x, y = item.getData()
    x, y = ([] if x is None else list(x)), ([] if y is None else list(y))
    return [((x[i], y[i]), (x[i + 1], y[i + 1])) for i in range(0, len(x), 2)]


def check_round_panel(view: SpeculativeView, r: SpeculativeRound) -> None:
    tree = view.round_tree
    assert not tree.crowded, "precondition: room for every label"
    nodes = shown_tree(view)
    has_target = r.target_kind != "none"
    assert len(nodes) == len(r.drafted) + has_target
    assert [text for text, _, _ in nodes] == [short(d.text) for d in r.drafted] + (
        [short(r.target_text)] if has_target else [])
    rejected = set(turned_down(r))
    for i, (_text, kind, colour) in enumerate(nodes[: len(r.drafted)]):
        judged = r.drafted[i].draw is not None  # sampled: a sibling tried before the accepted one
        want = ACCEPTED if i < r.accepted else REJECTED if i in rejected or judged else UNREACHED
        assert kind == want
        assert colour == QColor({ACCEPTED: ACCEPTED_COLOR, REJECTED: REJECTED_COLOR}.get(want, NODE_COLORS[UNREACHED]))
        d = r.drafted[i]
        tip = tree.nodes[i].toolTip()
        assert html_unescaped(format_percent(d.draft_prob)) in html_unescaped(tip)
        assert html_unescaped(format_percent(d.target_prob)) in html_unescaped(tip)
    if has_target:
        assert nodes[-1][1] == TARGET and nodes[-1][2] == QColor(TARGET_COLOR)
    # Edges parent -> child, at the nodes' depths; the path's (and the target's) in their own item, on one row.
    depths = depths_walked(r)
    path = edge_pairs(tree.path_edges)
    others = edge_pairs(tree.edges)
    assert len(path) == r.accepted + has_target and len(others) == len(r.drafted) - r.accepted
    assert [(a[0], b[0]) for a, b in path] == [(i - 1, i) for i in range(r.accepted + has_target)]
    assert {a[1] for a, _ in path} | {b[1] for _, b in path} == {0}
    parents = parents_of(r)
    assert sorted((a[0], b[0]) for a, b in others) == sorted(
        (depths[parents[i]] if parents[i] >= 0 else -1, depths[i]) for i in range(r.accepted, len(r.drafted)))
    assert all(b[1] >= a[1] for a, b in others)  # a branch runs below the row it leaves


def html_unescaped(text: str) -> str:
    import html

    return html.unescape(re.sub(r"<[^>]+>", "", text))


def pick_round(events: list) -> int:
    rounds = rounds_of(events)
    return next(i for i, r in enumerate(rounds) if r.accepted and turned_down(r)
                and len(turned_down(r)) < len(r.drafted) - r.accepted)


@pytest.mark.parametrize("fixture", ["greedy_tree", "sampled_tree"])
def test_the_round_panel_draws_the_tree(fixture, request, view):
    events = request.getfixturevalue(fixture)
    view.show_run(Run.from_events(events))
    rounds = rounds_of(events)
    index = pick_round(events)
    view.select_round(index)
    check_round_panel(view, rounds[index])
    assert not view._q_bars.opts["height"]  # no chain bars under the tree
    title = view.round_plot.getPlotItem().titleLabel.item.toPlainText()
    assert title.startswith(f"Round {index}: {rounds[index].accepted} of {len(rounds[index].drafted)} nodes")
    # Another round reuses the same node items.
    items = list(view.round_tree.nodes)
    other = next(i for i, r in enumerate(rounds) if i != index and r.drafted)
    view.select_round(other)
    check_round_panel(view, rounds[other])
    assert view.round_tree.nodes[: len(items)] == items
    k = {"greedy_tree": 5, "sampled_tree": 4}[fixture]
    assert "tree 3 wide ≤ 16 nodes" in view.header.text() and f"k = {k} deep" in view.header.text()
    assert "depth" in view.positions_plot.getPlotItem().getAxis("bottom").labelText


def heat_map_numbers(view: SpeculativeView) -> dict[tuple[int, int], tuple[str, str]]:
    out = {}
    for key, text in view.tree_grid.cell_texts().items():
        tokens, speedup = re.fullmatch(r"(\d+\.\d\d)(?: tokens · |\n| · )(\d+\.\d\d)×", text).groups()
        out[key] = (tokens, speedup)
    return out


@pytest.mark.parametrize("fixture", ["greedy_tree", "sampled_tree"])
def test_the_heat_maps_cells_are_the_recounted_grid(fixture, request, view):
    events = request.getfixturevalue(fixture)
    view.show_run(Run.from_events(events))
    tokens, _nodes, speedups = grid_by_hand(events)
    expected = {(d + 1, w + 1): (f"{tokens[d][w]:.2f}", f"{speedups[d][w]:.2f}")
                for d in range(len(tokens)) for w in range(len(tokens[0]))}
    assert heat_map_numbers(view) == expected
    assert all(view.tree_grid.cells[key].isVisible() for key in expected)
    # This run's cell, the whole tree, is outlined; the image has one pixel per cell.
    x, y = view.tree_grid.outline.getData()
    depth, width = len(tokens), len(tokens[0])
    assert (min(x), max(x), min(y), max(y)) == (depth - 0.5, depth + 0.5, width - 0.5, width + 0.5)
    assert view.tree_grid.image.image.shape[:2] == (width, depth)
    plot = view.what_if_plot.getPlotItem()
    assert plot.getAxis("bottom").labelText.startswith("depth") and plot.getAxis("left").labelText.startswith("width")
    assert not view._what_if_curve.isVisible()
    note = view.what_if_note.text() + view.what_if_note.toolTip()
    assert "Estimate, not measured" in note
    assert ("exact for greedy" in note) == (fixture == "greedy_tree")


def test_a_saved_trace_draws_the_same_tree(greedy_tree, tmp_path, qtbot, view):
    view.show_run(Run.from_events(greedy_tree))
    index = pick_round(greedy_tree)
    view.select_round(index)
    live_nodes, live_cells = shown_tree(view), heat_map_numbers(view)
    live_edges = (edge_pairs(view.round_tree.path_edges), edge_pairs(view.round_tree.edges))
    live_marks = view.state.marks

    path = tmp_path / "tree.jsonl"
    path.write_text("".join(dumps_event(e) + "\n" for e in greedy_tree), encoding="utf-8")
    saved = [event_from_dict(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()]
    assert rounds_of(saved) == rounds_of(greedy_tree) and isinstance(saved[-1], RunFinished)
    again = SpeculativeView()
    qtbot.addWidget(again)
    again.resize(1200, 700)
    again.show()
    again.show_run(Run.from_events(saved))
    again.select_round(index)
    check_round_panel(again, rounds_of(saved)[index])
    assert shown_tree(again) == live_nodes and heat_map_numbers(again) == live_cells
    assert (edge_pairs(again.round_tree.path_edges), edge_pairs(again.round_tree.edges)) == live_edges
    assert again.state.marks == live_marks


def test_a_chain_run_after_a_tree_run_is_drawn_as_a_chain(tree_lm, greedy_tree, view):
    view.show_run(Run.from_events(greedy_tree))
    chain = list(run_strategy(tree_lm, tree_settings(tree_width=1, baseline_tokens=0)))
    view.show_run(Run.from_events(chain))
    assert not view.round_tree.shown and not view.tree_grid.shown and not view.tree_grid.image.isVisible()
    r = rounds_of(chain)[view.selected_round]
    assert list(view._q_bars.opts["height"]) == pytest.approx([d.draft_prob for d in r.drafted])
    assert view._what_if_curve.isVisible() and len(view._what_if_curve.getData()[0]) == 17
    assert "tree" not in view.header.text()


@pytest.mark.parametrize("size", [(1280, 800), (1500, 950)], ids=["1280x800", "1500x950"])
@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "greedy"])
def test_a_tree_run_fits_the_window_whole(qtbot, tmp_path, tree_lm, size, sampled):
    """A tree run live in the window (sampled trees are the bushiest): no vertical scroll, every text whole."""
    from test_view_edges import edge_problems

    settings = tree_settings(do_sample=True, temperature=0.8) if sampled else tree_settings(draft_layers=1,
                                                                                          draft_k=5)
    w = open_window(qtbot, tmp_path, tree_lm, settings, size=size)
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=60000)
    w.docks["speculative"].raise_()
    for _ in range(5):
        QApplication.processEvents()
    view = w.views["speculative"]
    view.grab()
    assert w.size() == QSize(*size) and view.state.is_tree and view.round_tree.shown
    # Every node's label is centred on its depth, as drawn (placed while the run streamed, then laid out again).
    r = view.state.rounds[view.selected_round]
    box = view.round_plot.getPlotItem().getViewBox()
    depths = depths_walked(r) + ([r.accepted] if r.target_kind != "none" else [])
    for label, depth in zip(view.round_tree.nodes[: view.round_tree.shown], depths, strict=True):
        drawn = label.mapRectToScene(label.boundingRect()).center().x()
        assert drawn == pytest.approx(box.mapViewToScene(QPointF(depth, 0)).x(), abs=1.0), label.toPlainText()
    problems = edge_problems("speculative", view, allow_scroll=False)
    assert not problems, "\n".join(str(p) for p in problems)
    scrolled = [area.verticalScrollBar().maximum() for area in view.findChildren(QScrollArea)
                if area.isVisibleTo(view) and area.verticalScrollBar().maximum() > 0]
    assert not scrolled


def test_the_tree_figures_line_shows_counts_made_here_from_the_target_greedy_output(tree_lm, greedy_tree, view):
    """Each round's verdict redone here: walk its tree from the context, at each depth taking the child whose token
    is generate()'s greedy output there; the figures line must show those counts (accepted and off the path
    unequal, so a line that swapped them fails)."""
    prompt = list(greedy_tree[0].prompt_token_ids)
    ids = torch.tensor([prompt])
    output = tree_lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=30,
                                    pad_token_id=tree_lm.tokenizer.pad_token_id)[0, len(prompt):].tolist()
    rounds = rounds_of(greedy_tree)
    position = drafted = accepted = judged = 0
    for r in rounds:
        parents, node, kept = parents_of(r), -1, 0
        while position + kept < len(output):
            child = next((i for i, p in enumerate(parents)
                          if p == node and r.drafted[i].token_id == output[position + kept]), None)
            if child is None:
                break
            node, kept = child, kept + 1
        levels = max(depths_walked(r), default=-1) + 1
        drafted += len(r.drafted)
        accepted += kept
        judged += min(levels, kept + 1)
        position += kept + 1
    assert 0 < accepted < drafted and accepted != drafted - accepted, "precondition: unequal counts"
    view.show_run(Run.from_events(greedy_tree))
    text = re.sub(r"</?b>", "", view.figures.text())
    assert f"Acceptance: {format_percent(accepted / drafted)} of {drafted} drafted nodes ({accepted} accepted, " \
           f"{drafted - accepted} off the path) · α = {accepted / judged:.2f} per depth the target reached" in text
    assert f"Mean accepted per round: {accepted / len(rounds):.2f} drafts" in text
