"""Exported web pages of the quantization lab, recorded attention, cascade, contrastive decoding (and DoLa) and
contrastive search runs: each run saved, made into a page by the command line, opened in the headless Chromium, and
what the page shows read back against numbers computed here from the run's events (and, for the expert's
log-probabilities, from the model itself)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import TokenStep
from playground.events.attention import AttentionRow, AttentionStarted
from playground.events.cascade import FULL, CascadeResponse, CascadeStarted, CascadeStep
from playground.events.contrastive import ContrastiveStarted, ContrastStep
from playground.events.contrastive_search import SearchStarted, SearchStep
from playground.events.quant import QuantReady, QuantStep, QuantSummary, QuantTable
from playground.state.text import visible_token_text
from playground.traces import read_trace, write_trace
from playground.ui.style import format_percent
from playground.ui.web_page.sections.attention import TOP_POSITIONS

PROMPT = "Once upon a time"
RUNS = {
    "quant": {"strategy": "greedy", "quant": "rtn-int4", "group_size": 32, "compare": True, "max_new_tokens": 8},
    "attention": {"strategy": "kv-cache", "record_attention": True, "attention_top": 0, "compare_no_cache": False,
                  "max_new_tokens": 5},
    # A threshold the random model's confidences straddle: both models produce tokens.
    "cascade": {"strategy": "cascade", "cheap": "quantized", "cheap_quant": "rtn-int4-head",
                "cascade_threshold": 0.12, "max_new_tokens": 10},
    "cascade_response": {"strategy": "cascade", "cheap": "layers", "cheap_layers": 1, "cascade_unit": "response",
                         "cascade_threshold": 1.0, "max_new_tokens": 5},
    "contrastive": {"strategy": "contrastive", "amateur": "layer", "max_new_tokens": 6},
    "dola": {"strategy": "contrastive", "amateur": "dola", "dola_variant": "formula", "dola_layers": "0,1",
             "max_new_tokens": 5},
    "search": {"strategy": "contrastive-search", "top_k": 4, "penalty_alpha": 0.6, "max_new_tokens": 8},
}


def g4(value: float) -> str:
    """A number as the page's data keeps it (four significant digits), as JavaScript prints it."""
    return repr(float(f"{value:.4g}")).removesuffix(".0")


@pytest.fixture(scope="module")
def pages(tiny_lm, tmp_path_factory):
    """{kind: (events read back from the saved trace, page path)}."""
    from playground.cli import main

    folder = tmp_path_factory.mktemp("view-pages")
    made = {}
    for kind, options in RUNS.items():
        events = list(run_strategy(tiny_lm, RunSettings.from_flat(chat=False, prompt=PROMPT, **options)))
        write_trace(events, folder / f"{kind}.jsonl")
        saved = read_trace(folder / f"{kind}.jsonl")
        assert not saved.skipped and saved.events == events  # the saved run keeps every event the view draws
        assert main(["html", str(folder / f"{kind}.jsonl"), "--out", str(folder / f"{kind}.html")]) == 0
        made[kind] = (events, folder / f"{kind}.html")
    return made


def near3(shown: float, value: float) -> bool:
    """``shown`` is ``value`` to three significant digits (as the attention map keeps its weights)."""
    return abs(shown - value) <= 0.5001 * 10 ** (math.floor(math.log10(abs(value))) - 2)


def of(events, cls):
    return [e for e in events if isinstance(e, cls)]


def test_quant_page_shows_kl_per_token_layer_errors_and_the_methods(pages, open_page):
    events, path = pages["quant"]
    ready, steps = of(events, QuantReady)[0], of(events, QuantStep)
    summary, table = of(events, QuantSummary)[0], of(events, QuantTable)[0]
    page = open_page(path)
    assert f"{ready.method}, group {ready.group_size}: weights stored as {ready.stored}" in \
        page.inner_text("#quant-head")
    bars = page.locator("#quant-kl rect.kl")
    assert bars.count() == len(steps)
    for k in (0, len(steps) - 1):
        s = steps[k]
        assert bars.nth(k).locator("title").text_content() == (
            f"step {s.step} {visible_token_text(s.text)} · KL {g4(s.kl)} nats · reference p "
            f"{format_percent(float(f'{s.reference_prob:.4g}'))} · quantized p "
            f"{format_percent(float(f'{s.quantized_prob:.4g}'))} · quantized top "
            f"{visible_token_text(s.quantized_top_text)}" + ("" if s.top1_agrees else " (differs)"))
    heights = [float(bars.nth(k).get_attribute("height")) for k in range(len(steps))]
    top = max(range(len(steps)), key=lambda k: steps[k].kl)
    assert heights.index(max(heights)) == top  # the tallest bar is the largest KL
    assert page.locator("#quant-kl text.mark").count() == sum(not s.top1_agrees for s in steps)
    mean = sum(s.kl for s in steps) / len(steps)
    agree = sum(s.top1_agrees for s in steps) / len(steps)
    figures = page.inner_text("#quant-figures")
    assert f"teacher-forced over {len(steps)} tokens: mean KL {mean:.4f} nats" in figures
    assert f"top-1 agreement {format_percent(agree)}" in figures
    assert ("never diverged" if summary.first_divergence < 0 else
            f"first divergence at token {summary.first_divergence + 1}") in figures
    cells = page.locator("#quant-errors td.err")
    assert cells.count() == len(ready.layer_errors)
    titles = {cells.nth(k).get_attribute("title") for k in range(cells.count())}
    for error in ready.layer_errors:
        layer, kind = re.fullmatch(r"layers\.(\d+)\.(?:\w+\.)*(\w+)", error.name).groups()
        assert f"layer {int(layer) + 1} · {kind} · ‖W_q − W‖ / ‖W‖ = {g4(error.relative_error)}" in titles
    channels = page.locator("#quant-channels tr.chan")
    assert channels.count() == len(ready.channels) > 0
    for k, c in enumerate(ready.channels):
        cells = channels.nth(k).locator("td").all_inner_texts()
        ordered = sorted(c.act_max_before)
        middle = len(ordered) // 2
        median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
        assert cells[0] == c.name and math.isclose(float(cells[1].rstrip("×")), max(ordered) / median, rel_tol=5e-3)
        assert cells[3] == (str(len(c.scales)) if c.scales else "none: plain round-to-nearest")
    rows = page.locator("#quant-table tr.method")
    assert [rows.nth(k).locator("td").nth(0).inner_text() for k in range(rows.count())] == \
        [r.method for r in table.rows]
    assert rows.nth(0).locator("td").nth(6).inner_text() == format_percent(table.rows[0].top1_agreement)


def test_attention_page_maps_a_tokens_weights_and_sums_up_the_run(pages, open_page):
    events, path = pages["attention"]
    started, rows = of(events, AttentionStarted)[0], of(events, AttentionRow)
    texts = [visible_token_text(t) for t in started.prompt_tokens] + \
        [visible_token_text(e.text) for e in of(events, TokenStep)]

    def mean_weights(row, layer):  # position -> the weight of the mean over heads
        out: dict[int, float] = {}
        for positions, weights in zip(row.positions[layer], row.weights[layer], strict=True):
            for p, w in zip(positions, weights, strict=True):
                out[p] = out.get(p, 0.0) + w / len(row.positions[layer])
        return out

    page = open_page(path)
    last = rows[-1]
    cells = page.locator("#att-map td[title]")  # each layer's TOP_POSITIONS heaviest positions
    assert cells.count() == started.layers * min(TOP_POSITIONS, last.query_position + 1)
    top_layer = mean_weights(last, started.layers - 1)
    p = max(top_layer, key=top_layer.get)
    row0 = page.locator("#att-map tr").nth(0).locator("td")  # the last layer: the map's top row
    title = row0.nth(p).get_attribute("title")
    assert title.startswith(f"token {last.step} · layer {started.layers} · position {p} {texts[p]} · weight ")
    assert near3(float(title.rsplit(" ", 1)[1]), top_layer[p])
    # The slider picks another token: its map, one query position shorter per step.
    page.locator("#att-step").evaluate("(el) => {el.value = 0; el.dispatchEvent(new Event('input'))}")
    assert page.locator("#att-map td[title]").count() == started.layers * min(TOP_POSITIONS,
                                                                              rows[0].query_position + 1)
    first = mean_weights(rows[0], 0)
    p = max(first, key=first.get)
    cell = page.locator("#att-map tr").nth(started.layers - 1).locator("td").nth(p)  # layer 1's heaviest position
    assert near3(float(cell.get_attribute("title").rsplit(" ", 1)[1]), first[p])
    assert "att-sel" in page.locator("#att-text span").nth(rows[0].query_position + 1).get_attribute("class")
    # The sink: the mean over steps, layers and heads of the weight on the first four positions.
    sink = sum(mean_weights(r, layer).get(q, 0.0) for r in rows for layer in range(started.layers)
               for q in range(4)) / started.layers / len(rows)
    assert f"the first 4 positions receive {format_percent(float(f'{sink:.4g}'))} of all attention (mean over " \
           f"{len(rows)} steps" in page.inner_text("#att-summary")
    bars = page.locator("#att-distance rect.dist")
    titles = [bars.nth(k).locator("title").text_content() for k in range(bars.count())]
    distance_zero = sum(mean_weights(r, layer).get(r.query_position, 0.0) for r in rows
                        for layer in range(started.layers)) / started.layers / len(rows)
    assert titles[0].startswith("query − key distance 0: ")
    assert math.isclose(float(titles[0].split(": ")[1].split("%")[0]), 100 * distance_zero, rel_tol=1e-3)


def test_cascade_page_colours_each_token_by_its_model_and_bars_the_cheap_confidence(pages, open_page):
    events, path = pages["cascade"]
    started = of(events, CascadeStarted)[0]
    output = [s for s in of(events, CascadeStep) if not s.draft]
    page = open_page(path)
    spans = page.locator("#cas-text span.cas")
    assert spans.count() == len(output)
    assert [spans.nth(k).get_attribute("class").split()[1] for k in range(len(output))] == [s.producer for s in output]
    assert {s.producer for s in output} == {"cheap", "full"}, "the run should show both models"
    escalations = sum(1 for k, s in enumerate(output) if s.producer == FULL and (k == 0 or output[k - 1].producer
                                                                                 != FULL))
    assert page.locator("#cas-text b.esc").count() == escalations
    bars = page.locator("#cas-strip rect.conf")
    shown = [s for s in output if s.cheap_prob is not None]
    assert bars.count() == len(shown)
    s = shown[-1]
    title = bars.nth(len(shown) - 1).locator("title").text_content()
    assert f": p = {format_percent(float(f'{s.cheap_prob:.4g}'))} {'<' if s.cheap_prob < started.threshold else '≥'}" \
           f" threshold {started.threshold:g}" in title
    if s.full_prob is not None:
        assert f"full model: p = {format_percent(float(f'{s.full_prob:.4g}'))} · read {s.full_read}" in title
    heights = [float(bars.nth(k).get_attribute("height")) for k in range(len(shown))]
    line_y = float(page.locator("#cas-strip line.hline").get_attribute("y1"))
    tops = [float(bars.nth(k).get_attribute("y")) for k in range(len(shown))]
    for s, y in zip(shown, tops, strict=True):  # above the threshold line exactly where p ≥ the threshold
        if abs(s.cheap_prob - started.threshold) > 0.005:  # (closer, the two share a pixel)
            assert (y < line_y) == (s.cheap_prob >= started.threshold)
    assert max(heights) > 0
    full = sum(s.producer == FULL for s in output)
    assert f"Full model: {full} of {len(output)} tokens ({100 * full / len(output):.1f}%) in {escalations} escalation" \
        in page.inner_text("#cas-figures")

    events, path = pages["cascade_response"]
    drafts = [s for s in of(events, CascadeStep) if s.draft]
    response = of(events, CascadeResponse)[0]
    page = open_page(path)
    assert page.locator("#cas-text s span.cas.discarded").count() == (len(drafts) if response.escalated else 0)
    assert page.locator("#cas-strip rect.conf").count() == sum(s.cheap_prob is not None for s in drafts)
    assert f"mean p {response.mean_prob:.3f} over {response.tokens} tokens" in page.inner_text("#cas-figures")


def _expert_logprobs(lm, events):
    """log p of every step's candidates from the model itself: the prompt and the output so far, one pass."""
    from playground.engine.prompt import encode_prompt

    ids, _ = encode_prompt(lm, RunSettings.from_flat(chat=False, prompt=PROMPT))
    out = [e.token_id for e in of(events, TokenStep)]
    with torch.inference_mode():
        logits = lm.model(torch.tensor([ids + out])).logits[0].float()
    return torch.log_softmax(logits[len(ids) - 1:], dim=-1)  # row k: step k's distribution


def test_contrastive_page_names_the_amateur_and_shows_each_steps_candidates(pages, open_page, tiny_lm):
    events, path = pages["contrastive"]
    steps = of(events, ContrastStep)
    page = open_page(path)
    assert page.inner_text("#con-head").startswith("amateur layer: ")
    strip = page.locator("#con-strip span.cstep")
    assert strip.count() == len(steps)
    assert page.locator("#con-strip span.cstep.changed").count() == sum(s.changed for s in steps)
    reference = _expert_logprobs(tiny_lm, events)
    for k in (0, len(steps) - 1):
        strip.nth(k).hover()
        rows = page.locator("#con-cand tr.ccand")
        assert rows.count() == len(steps[k].candidates)
        for r, c in enumerate(steps[k].candidates[:3]):
            cells = rows.nth(r).locator("td").all_inner_texts()
            assert cells[0] == visible_token_text(c.text)
            assert cells[2] == f"{float(f'{c.expert_logprob:.4g}'):.3f}"
            assert cells[3] == f"{float(f'{c.amateur_logprob:.4g}'):.3f}"
            assert abs(float(cells[2]) - reference[k, c.token_id].item()) < 2e-3  # the model's own log p
            assert (cells[4] == "−∞") == (not c.plausible)
            assert (cells[6] == "★") == (c.token_id == steps[k].token_id)
    changed = sum(s.changed for s in steps)
    assert f"changed the expert's choice at {changed} of {len(steps)} steps" in page.inner_text("#con-figures")

    events, path = pages["dola"]
    started, steps = of(events, ContrastiveStarted)[0], of(events, ContrastStep)
    page = open_page(path)
    assert page.inner_text("#con-head").startswith("amateur dola · variant formula (JSD")
    cells = page.locator("#con-dola td[title]")
    assert cells.count() == len(started.dola_layers) * len(steps)
    marked = page.locator("#con-dola td.pick")
    assert marked.count() == len(steps)
    layers = [re.search(r"layer (\d+)", marked.nth(k).get_attribute("title")).group(1) for k in range(len(steps))]
    by_step = sorted(zip([int(re.search(r"step (\d+)", marked.nth(k).get_attribute("title")).group(1))
                          for k in range(len(steps))], layers, strict=True))
    assert [int(layer) for _, layer in by_step] == [s.premature_layer for s in steps]
    title = page.locator("#con-dola tr").nth(1).locator("td").nth(0).get_attribute("title")
    assert title.startswith(f"step 0 · layer {started.dola_layers[0]} · divergence {g4(steps[0].layer_jsd[0])} nats")


def test_contrastive_search_page_shows_overturned_steps_and_their_candidates(pages, open_page):
    events, path = pages["search"]
    started, steps = of(events, SearchStarted)[0], of(events, SearchStep)
    # The text of each position: the prompt's tokens, then each step's token as the output decoded it.
    texts = [visible_token_text(t) for t in started.context_tokens] + \
        [visible_token_text(e.text) for e in of(events, TokenStep)]
    page = open_page(path)
    overturned = sum(s.overturned for s in steps if not s.forced)
    assert f"α = {started.alpha:g} · k = {started.k} · the penalty overturned the model's top choice at {overturned} " \
           f"of {len(steps)} steps" in page.inner_text("#cs-head")
    strip = page.locator("#cs-strip span.sstep")
    assert strip.count() == len(steps)
    assert page.locator("#cs-strip span.sstep.over").count() == overturned
    for k in (0, len(steps) - 1):
        strip.nth(k).click()
        rows = page.locator("#cs-cand tr.scand")
        assert rows.count() == len(steps[k].candidates) == started.k
        for r, c in enumerate(steps[k].candidates):
            cells = rows.nth(r).locator("td").all_inner_texts()
            where = (f"prompt token {c.similar_position}" if c.similar_position < len(started.context_tokens)
                     else f"step {c.similar_position - len(started.context_tokens)}")
            assert cells[1:] == [visible_token_text(c.text), format_percent(float(f"{c.confidence:.4g}")),
                                 f"{float(f'{c.penalty:.4g}'):.3f}", f"{texts[c.similar_position]} ({where})",
                                 f"{float(f'{c.score:.4g}'):+.3f}"]
            # The score is the rule's: (1 − α)·p − α·penalty.
            assert math.isclose(c.score, (1 - started.alpha) * c.confidence - started.alpha * c.penalty, abs_tol=1e-5)
        assert ["win" in (rows.nth(r).get_attribute("class") or "") for r in range(rows.count())] == \
            [r == steps[k].winner for r in range(rows.count())]


def test_the_view_pages_read_on_a_phone_and_stay_small(pages, open_page):
    for kind, (_events, path) in pages.items():
        page = open_page(path, width=390, height=844)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390, kind
        section = {"quant": "quant", "attention": "attention", "cascade": "cascade", "cascade_response": "cascade",
                   "contrastive": "contrastive", "dola": "contrastive", "search": "search"}[kind]
        assert page.locator(f"#{section}-section").is_visible(), kind  # its script ran without an error
        assert path.stat().st_size < 60_000, kind
