"""A saved run as one web page (``playground html RUN --out run.html``), opened in a real headless Chromium
(Debian's, driven by Playwright; never a downloaded browser): what it shows is read back and compared with the run's
events and the app's own colours and number formats, and the page may ask the network for nothing."""

from __future__ import annotations

import re

import pytest
from web_pages import rgb

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import LayerStep, RunFinished, TokenStep
from playground.events.beam import BeamStep
from playground.events.panes import PaneToken
from playground.events.speculative import SpeculativeRound
from playground.state.text import visible_token_text
from playground.traces import write_trace
from playground.ui.style import format_percent, shade_for_prob

RUNS = {
    # Sampled with a temperature and top-k: the raw and the processed numbers differ, and some candidates are cut.
    "greedy": {"strategy": "sample", "temperature": 0.7, "top_k": 4, "seed": 3, "max_new_tokens": 8,
               "prompt": "你好，世界. Once upon"},
    "speculative": {"strategy": "speculative", "draft": "jacobi", "max_new_tokens": 8, "baseline_tokens": 0},
    "lens": {"strategy": "greedy", "lens": True, "max_new_tokens": 5},
    "beam": {"strategy": "beam", "num_beams": 3, "num_return_sequences": 2, "max_new_tokens": 5},
    "compare": {"strategy": "compare", "panes": ("greedy", "sample --temperature 0.8 --seed 2"), "max_new_tokens": 5},
}


@pytest.fixture(scope="module")
def pages(tiny_lm, tmp_path_factory):
    """Each kind of run, saved and made into a page by the command line: {kind: (events, page path)}."""
    from playground.cli import main

    folder = tmp_path_factory.mktemp("pages")
    made = {}
    for kind, options in RUNS.items():
        events = list(run_strategy(tiny_lm, RunSettings.from_flat(chat=False, **{"prompt": "Once upon a time",
                                                                                  **options})))
        write_trace(events, folder / f"{kind}.jsonl")
        assert main(["html", str(folder / f"{kind}.jsonl"), "--out", str(folder / f"{kind}.html")]) == 0
        made[kind] = (events, folder / f"{kind}.html")
    return made


def test_the_output_is_shaded_as_the_app_shades_it_and_hover_shows_each_candidate(pages, open_page):
    events, path = pages["greedy"]
    steps = [e for e in events if isinstance(e, TokenStep)]
    page = open_page(path)
    tokens = page.locator("#out span.tok")
    assert tokens.count() == len(steps)
    assert "你好，世界" in page.inner_text("#out .prompt")
    for k in (0, 3, len(steps) - 1):
        step = steps[k]
        colour = tokens.nth(k).evaluate("el => getComputedStyle(el).backgroundColor")
        assert colour == rgb(shade_for_prob(step.raw_prob).name())
        tokens.nth(k).hover()
        tip = page.inner_text("#tip")
        assert f"Step {k} · raw {format_percent(step.raw_prob)} · after processors {format_percent(step.prob)}" \
            f" · raw rank {step.raw_rank}" in tip
        rows = [line.split("\t") for line in tip.splitlines() if "\t" in line][1:]  # after the header row
        assert [(r[0], r[1], r[2]) for r in rows] == [
            (visible_token_text(c.text), format_percent(c.raw_prob),
             f"cut by {c.cut_by}" if c.cut_by else format_percent(c.processed_prob)) for c in step.candidates]
        assert [r[0] for r in rows if r[-1].strip() == "◀ chosen"] == [
            visible_token_text(c.text) for c in step.candidates if c.token_id == step.token_id]
    ticks = page.locator("#ramp span").all_inner_texts()
    assert ticks == ["100%", "10%", "1%", "≤0.1%"]


def test_a_phone_reads_it_tapping_a_token_and_nothing_runs_off_the_side(pages, open_page):
    _events, path = pages["greedy"]
    page = open_page(path, width=390, height=844)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.locator("#out span.tok").nth(2).click()  # a tap is a click to the page
    box = page.locator("#tip").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
    assert "Step 2" in page.inner_text("#tip")


def test_speculative_marks_lens_cells_and_beams_come_from_their_runs(pages, open_page):
    events, path = pages["speculative"]
    rounds = [e for e in events if isinstance(e, SpeculativeRound)]
    kept = sum(min(r.accepted, r.emitted) for r in rounds)
    corrections = sum(1 for r in rounds if r.target_kind == "correction" and r.accepted < r.emitted)
    page = open_page(path)
    assert page.locator("#out span.tok.accepted").count() == kept
    assert page.locator("#out span.tok.correction").count() == corrections
    first = next(r for r in rounds if r.accepted > 0) if kept else None
    if first is not None:
        page.locator("#out span.tok").nth(first.first_step).hover()
        assert f"q {format_percent(first.drafted[0].draft_prob)} · p {format_percent(first.drafted[0].target_prob)}" \
            in page.inner_text("#tip")

    events, path = pages["lens"]
    lens = [e for e in events if isinstance(e, LayerStep)]
    page = open_page(path)
    cells = page.locator("#lens td[title]")
    assert cells.count() == sum(1 for e in lens for h in e.layer_entropy if h is not None)
    title = page.locator("#lens tr").nth(0).locator("td").nth(1).get_attribute("title")  # the last layer, step 1
    top = lens[1].layer_entropy[-1]
    assert title is not None and re.search(rf"step {lens[1].step} · layer {len(lens[1].layer_entropy)} · "
                                           rf"{float(f'{top:.3g}')} bits", title)

    events, path = pages["beam"]
    sequences = next(e for e in events if isinstance(e, RunFinished)).sequences
    beam_steps = [e for e in events if isinstance(e, BeamStep)]
    page = open_page(path)
    nodes = page.locator("#tree g.node")
    assert nodes.count() == sum(len(e.candidates) for e in beam_steps)
    assert page.locator("#tree g.node.survived").count() == sum(c.survived for e in beam_steps for c in e.candidates)
    last = beam_steps[-1].candidates[0]
    assert page.locator("#tree g.node title").nth(nodes.count() - len(beam_steps[-1].candidates)).text_content() \
        .startswith(f"step {beam_steps[-1].step} · {visible_token_text(last.text)} · token log-prob "
                    f"{float(f'{last.token_logprob:.4g}')} · beam score {float(f'{last.score:.4g}')}")
    kv = page.locator("#kv circle.kv title")  # the beams' cache, after the prompt and each step
    assert kv.count() == 1 + len(beam_steps)
    assert kv.nth(len(beam_steps)).text_content() == \
        f"after step {beam_steps[-1].step}: {beam_steps[-1].kv_cache_bytes / 1048576:.2f} MB"
    rows = page.locator("#beams tr")
    assert rows.count() == 1 + len(sequences)
    assert [rows.nth(k + 1).locator("td").nth(3).inner_text() for k in range(len(sequences))] == \
        [q.text for q in sequences]


def test_side_by_side_panes_each_show_their_own_tokens_and_shades(pages, open_page):
    events, path = pages["compare"]
    page = open_page(path)
    panes = page.locator("#panes .pane")
    started = [e for e in events if type(e).__name__ == "PaneStarted"]
    assert panes.count() == len(started) == 2
    for k, start in enumerate(started):
        tokens = [e for e in events if isinstance(e, PaneToken) and e.pane == start.pane]
        pane = panes.nth(k)
        assert pane.locator("h3").inner_text() == start.label
        spans = pane.locator("span.ptok")
        assert spans.count() == len(tokens)
        last = spans.nth(len(tokens) - 1)
        assert last.get_attribute("title") == f"pane {k + 1} · step {len(tokens) - 1} · p " \
            f"{format_percent(tokens[-1].prob)}"
        colour = last.evaluate("el => getComputedStyle(el).backgroundColor")
        assert colour == rgb(shade_for_prob(tokens[-1].prob).name())


def test_the_page_is_small_and_refuses_other_names(pages, tmp_path, capsys):
    from playground.cli import main

    _events, path = pages["greedy"]
    assert path.stat().st_size < 40_000
    trace = path.with_suffix(".jsonl")
    assert main(["html", str(trace), "--out", str(tmp_path / "page.txt")]) == 2
    assert "a web page is an .html file" in capsys.readouterr().err
    assert main(["html", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x.html")]) == 2
    assert not (tmp_path / "x.html").exists()
