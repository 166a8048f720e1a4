"""The web page of a steered, a watermarked, an attributed ("why this token"), a salience and a patching run: each
run saved as a trace, made into a page by the command line, opened in the headless browser, and what its section
shows read back against numbers worked out here from the run's events (z-scores from the colours, the commitment
layer from the lens's candidates, Spearman's ρ from the scores, a steering strength against the vector file's own
norms) and the app's own colours."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from playground.config import RunSettings
from playground.config.patching import PatchingSettings
from playground.engine.steering.files import load_vector, save_vector
from playground.engine.steering.vector import SteeringVector
from playground.engine.strategies import run_strategy
from playground.events import LayerStep, TokenStep
from playground.events.dla import LogitAttribution
from playground.events.patching import PatchingRow, PatchingStarted
from playground.events.salience import METHOD_TITLES, SalienceAgreement, SalienceMap
from playground.events.steering import SteeringNorms, SteeringStarted, SteerStep
from playground.events.watermark import WatermarkStarted, WatermarkStep
from playground.state.text import visible_token_text
from playground.traces import write_trace
from playground.ui.style import format_percent

PROMPT = "Once upon a time"
CLEAN, CORRUPTED = "the cat sat on the mat", "the mat sat on the cat"  # as many tokens each
RUNS = {
    "steering": {"strategy": "greedy", "steer_compare": True, "max_new_tokens": 6},
    "kirchenbauer": {"strategy": "sample", "watermark": "kirchenbauer", "seed": 2, "max_new_tokens": 12},
    "synthid": {"strategy": "sample", "watermark": "synthid", "ngram_len": 3, "seed": 2, "max_new_tokens": 8},
    "dla": {"strategy": "greedy", "lens": True, "attribute_steps": "all", "max_new_tokens": 5},
    "salience": {"strategy": "greedy", "salience": "all", "salience_step": 2, "ig_steps": 8, "max_new_tokens": 3},
}


def rgb_of(css: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.findall(r"\d+", css)[:3])


def close(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Two colours one rounding apart at most in each channel (the page mixes in JavaScript, the app in Qt)."""
    return len(a) == len(b) and all(abs(x - y) <= 1 for x, y in zip(a, b, strict=True))


def short(v: float, digits: int = 4) -> float:
    return float(f"{v:.{digits}g}")


@pytest.fixture(scope="module")
def pages(tiny_lm, tmp_path_factory):
    """Each kind of run, saved and made into a page by the command line: {kind: (events, page path)}."""
    from playground.cli import main

    folder = tmp_path_factory.mktemp("view-pages")
    config = tiny_lm.model.config
    rng = np.random.default_rng(1)
    directions = {n: (d / np.linalg.norm(d) * 2.0).astype(np.float32)  # a mean difference: not unit-norm
                  for n, d in ((n, rng.standard_normal(config.hidden_size)) for n in range(config.num_hidden_layers))}
    vector = save_vector(SteeringVector(directions, hidden_size=config.hidden_size,
                                        layer_count=config.num_hidden_layers, model_name=tiny_lm.name, name="calm"),
                         folder / "calm.safetensors")
    settings = {kind: RunSettings.from_flat(chat=False, prompt=PROMPT, **options) for kind, options in RUNS.items()}
    settings["steering"] = RunSettings.from_flat(chat=False, prompt=PROMPT, steer=(f"{vector}:1.5",),
                                                 **RUNS["steering"])
    settings["patching"] = RunSettings(strategy="patching", prompt=CLEAN, chat=False,
                                       groups=(PatchingSettings(corrupted=CORRUPTED),))
    made = {"vector": vector}
    for kind, run in settings.items():
        events = list(run_strategy(tiny_lm, run))
        write_trace(events, folder / f"{kind}.jsonl")
        assert main(["html", str(folder / f"{kind}.jsonl"), "--out", str(folder / f"{kind}.html")]) == 0
        made[kind] = (events, folder / f"{kind}.html")
    return made


def opened(open_page, path, section: str, width: int = 1000):
    """The page, with the section drawn (its script ran without an error: a failing one leaves it hidden)."""
    page = open_page(path, width=width)
    assert page.locator(f"#{section}-section").is_visible()
    return page


def test_steering_map_table_and_comparison_come_from_the_run(pages, open_page):
    from playground.ui.views.steering.heatmap import diverging_colormap, symmetric_top

    events, path = pages["steering"]
    start = next(e for e in events if isinstance(e, SteeringStarted))
    norms = next(e for e in events if isinstance(e, SteeringNorms))
    steps = [e for e in events if isinstance(e, SteerStep)]
    tokens = [e for e in events if isinstance(e, TokenStep)]
    page = opened(open_page, path, "steering")
    # The strength against the residual: 1.5 × ‖direction‖ (the file's) / the block's median norm
    file = load_vector(pages["vector"])
    relative = [1.5 * float(np.linalg.norm(file.directions[n])) / norms.residual_norms[norms.layers.index(n)]
                for n in start.layers]
    assert f"calm × +1.5 = {min(relative):.2f}–{max(relative):.2f}× ‖h‖ at its blocks on blocks 0–1 · " \
        f"{len(steps)} tokens" in page.inner_text("#steer-head")
    cells = page.locator(".steer-map td[title]")
    assert cells.count() == len(steps) * len(start.layers)
    projections = np.array([s.projections[0] for s in steps]).T  # [blocks, tokens]
    top = symmetric_top(projections)
    block, token = len(start.layers) - 1, len(steps) - 1  # the top row's last cell
    cell = page.locator(".steer-map tr").nth(0).locator("td").nth(token)
    value = projections[block, token]
    assert cell.get_attribute("title") == f"block {start.layers[block]} · token {token} " \
        f"{visible_token_text(tokens[token].text)} · projection {short(value)}"
    expected = diverging_colormap().map(0.5 + value / (2 * top), mode="qcolor")
    assert close(rgb_of(cell.evaluate("el => getComputedStyle(el).backgroundColor")),
                 (expected.red(), expected.green(), expected.blue()))
    rows = page.locator(".steer-table tr")
    assert rows.count() == 1 + len(steps)
    assert rows.nth(len(steps)).locator("td").all_inner_texts() == [
        str(token), visible_token_text(tokens[-1].text), "+1.5", format_percent(steps[-1].steered_prob),
        format_percent(steps[-1].unsteered_prob), f"{steps[-1].kl:.4f}"]
    mean_kl = sum(s.kl for s in steps) / len(steps)
    perplexity = math.exp(-sum(math.log(s.unsteered_prob) for s in steps) / len(steps))
    assert f"mean KL(steered ‖ unsteered) {mean_kl:.4f} nats · the text's perplexity under the unsteered model " \
        f"{perplexity:.2f}" in page.inner_text("#steer-compare")
    assert page.locator("circle.unsteered").count() == len(steps)
    assert page.locator("rect.kl").count() == len(steps)
    assert f"block 1: {norms.residual_norms[1]:.1f}" in page.inner_text("#steer-norms")


def z_and_p(colours: list[float], gamma: float) -> tuple[float, float]:
    """Kirchenbauer et al.'s one-sided z-test of the green count, and its p-value."""
    n, green = len(colours), sum(colours)
    z = (green - gamma * n) / math.sqrt(n * gamma * (1 - gamma))
    return z, 0.5 * math.erfc(z / math.sqrt(2))


def test_watermark_colours_running_z_and_verdict_come_from_the_run(pages, open_page):
    from playground.ui.views.watermark.colours import colour_of

    events, path = pages["kirchenbauer"]
    start = next(e for e in events if isinstance(e, WatermarkStarted))
    marks = [e for e in events if isinstance(e, WatermarkStep)]
    page = opened(open_page, path, "watermark")
    scored = [m.colour for m in marks if m.scored]
    z, p = z_and_p(scored, start.greenlist_ratio)
    verdict = "watermarked" if z > start.threshold else "not (yet) detected"
    assert page.inner_text("#wm-verdict") == f"z = {z:.2f} (threshold {start.threshold:g}), p = {p:.2e} over " \
        f"{len(scored)} scored tokens: {verdict}"
    high = [m.colour for m in marks if m.scored and m.entropy is not None and m.entropy >= 2.0]
    low = [m.colour for m in marks if m.scored and m.entropy is not None and m.entropy < 2.0]

    def share(v: list[float]) -> str:
        return f"{sum(v) / len(v):.0%} of {len(v)}" if v else "none"

    assert f"green: {share(low)} below 2 bits of entropy, {share(high)} at or above" in page.inner_text("#wm-head")
    spans = page.locator("#wm-text span.wmtok")
    assert spans.count() == len(marks)
    for k in range(len(marks)):
        colour = colour_of(marks[k])
        shown = spans.nth(k).evaluate("el => getComputedStyle(el).backgroundColor")
        assert rgb_of(shown) == (colour.red(), colour.green(), colour.blue())
        assert float(shown.rsplit(",", 1)[1].strip(" )")) == pytest.approx(colour.alpha() / 255, abs=0.005)
    running_z = z_and_p(scored[:len(scored) // 2], start.greenlist_ratio)[0]  # the z after half the scored tokens
    half = [k for k, m in enumerate(marks) if m.scored][len(scored) // 2 - 1]
    assert spans.nth(half).get_attribute("title").endswith(f"; z so far {running_z:.2f}")
    dots = page.locator("circle.z")
    assert dots.count() == len(marks)
    assert dots.nth(len(marks) - 1).text_content() == f"step {marks[-1].step}: z {z:.2f}"
    threshold = page.locator("line.hline").first
    assert threshold.text_content() == f"threshold {start.threshold:g}"


def test_synthid_tokens_show_their_g_values_on_a_stretched_scale(pages, open_page):
    from playground.ui.views.watermark.colours import colour_of

    events, path = pages["synthid"]
    marks = [e for e in events if isinstance(e, WatermarkStep)]
    assert any(m.scored and 0 < m.colour < 1 for m in marks), "precondition: a mean g-value between the ends"
    page = opened(open_page, path, "watermark")
    spans = page.locator("#wm-text span.wmtok")
    assert spans.count() == len(marks)
    for k, m in enumerate(marks):
        assert spans.nth(k).get_attribute("title").startswith(
            f"step {m.step}: g-values {''.join(map(str, m.g_values))} (mean {sum(m.g_values) / len(m.g_values):.2f})")
        colour = colour_of(m)
        assert rgb_of(spans.nth(k).evaluate("el => getComputedStyle(el).backgroundColor")) == \
            (colour.red(), colour.green(), colour.blue())
    assert "mean g: " in page.inner_text("#wm-head")


def quadrant(h: float, v: float) -> str:
    """entropix's quadrants (H bits, V bits²), in its sampler's order of checks."""
    return ("flowing" if h < 0.1 and v < 0.1 else "careful" if h > 3 and v < 0.1 else "forks" if h < 5 and v > 5
            else "mist" if h > 5 and v > 5 else "middle")


def test_why_this_token_strips_and_attribution_come_from_the_run(pages, open_page):
    events, path = pages["dla"]
    steps = [e for e in events if isinstance(e, TokenStep)]
    lens = {e.step: e for e in events if isinstance(e, LayerStep)}
    attributions = [e for e in events if isinstance(e, LogitAttribution)]
    page = opened(open_page, path, "dla")
    dots = page.locator("#dla-uncertainty circle.quad")
    assert dots.count() == len(steps)
    for k, s in enumerate(steps):
        assert dots.nth(k).text_content() == f"step {k} {visible_token_text(s.text)}: H {s.entropy:.3f} bits, " \
            f"V {s.varentropy:.3f} bits², {quadrant(s.entropy, s.varentropy)}"
    # The commitment strip: the first layer from which every later layer's lens has the token on top
    top1 = page.locator(".dla-commit tr").nth(0).locator("td")
    assert top1.count() == len(steps)
    for k, s in enumerate(steps):
        on_top = [bool(c) and c[0].token_id == s.token_id for c in lens[k].layer_top]
        first = next((i + 1 for i in range(len(on_top)) if all(on_top[i:])), None)
        title = top1.nth(k).get_attribute("title")
        assert title == (f"step {k} {visible_token_text(s.text)}: top-1 kept from layer {first} of {len(on_top)}"
                         if first else f"step {k} {visible_token_text(s.text)}: never kept at top-1")
    # Each attributed step: the last one drawn first, any other picked
    assert page.locator("#dla-pick option").count() == len(attributions)
    for a in (attributions[-1], attributions[0]):
        page.select_option("#dla-pick", str(attributions.index(a)))
        summary = page.inner_text("#dla-summary")
        assert summary.startswith(
            f"Step {a.step}: '{visible_token_text(a.token_text)}' over '{visible_token_text(a.against_text)}' by "
            f"Δ {a.difference:+.3f} logits = embeddings {a.embeddings:+.3f} + attention {sum(a.attention):+.3f} + "
            f"MLP {sum(a.mlp):+.3f} + norm bias {a.norm_bias:+.3f}")
        bars = page.locator("#dla-bars rect.attn")
        assert bars.count() == len(a.attention)
        assert [bars.nth(i).text_content() for i in range(len(a.attention))] == [
            f"layer {i + 1} attention {v:+.4f}" for i, v in enumerate(a.attention)]
        running = np.cumsum([a.embeddings + a.norm_bias + a.attention[i] + a.mlp[i] + a.other[i] if i == 0 else
                             a.attention[i] + a.mlp[i] + a.other[i] for i in range(len(a.attention))])
        assert page.locator("#dla-bars circle.running").nth(len(a.attention) - 1).text_content() == \
            f"after layer {len(a.attention)}: running sum {float(running[-1]):+.4f}"
        heads = page.locator(".dla-heads td")
        assert heads.count() == sum(len(h) for h in a.heads)


def spearman(a, b) -> float:
    """Spearman's ρ: the Pearson correlation of the ranks (ties take their mean rank)."""
    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for x in np.unique(v):
            r[v == x] = r[v == x].mean()
        return r
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def test_salience_rows_scores_and_agreement_come_from_the_run(pages, open_page):
    from playground.ui.views.attribution_maps.salience import score_colour

    events, path = pages["salience"]
    maps = {e.method: e for e in events if isinstance(e, SalienceMap)}
    agreement = next(e for e in events if isinstance(e, SalienceAgreement))
    page = opened(open_page, path, "salience")
    first = next(iter(maps.values()))
    assert page.inner_text("#sal .note").startswith(
        f"Step {first.step}: why '{visible_token_text(first.target_text)}' (log p {first.target_logprob:.3f}")
    rows = page.locator("#sal .sal-row")
    assert rows.count() == len(maps)
    for k, (method, m) in enumerate(maps.items()):
        row = rows.nth(k)
        assert row.get_attribute("data-method") == method
        assert row.locator("b").first.inner_text() == METHOD_TITLES[method]
        spans = row.locator("span.stok")
        assert spans.count() == len(m.tokens)
        top = max(abs(s) for s in m.scores)
        best = max(range(len(m.scores)), key=lambda i: abs(m.scores[i]))
        for i in (0, best):
            assert spans.nth(i).get_attribute("title") == f"{m.scores[i]:+.3f}"
            assert close(rgb_of(spans.nth(i).evaluate("el => getComputedStyle(el).backgroundColor")),
                         rgb_of(",".join(str(int(score_colour(m.scores[i], top)[j:j + 2], 16)) for j in (1, 3, 5))))
        assert f"(±{float(f'{top:.3g}')} nats)" in row.inner_text()
    said = page.inner_text("#sal-agree")
    for a, b in agreement.pairs:
        rho = spearman(maps[a].scores, maps[b].scores)
        assert f"{METHOD_TITLES[a]} ~ {METHOD_TITLES[b]}: ρ = {rho:+.2f}" in said
        assert (f"{METHOD_TITLES[a]} and {METHOD_TITLES[b]} disagree" in said) == (rho < 0.5)


def test_patching_maps_come_from_the_run(pages, open_page):
    from playground.ui.views.steering.heatmap import diverging_colormap

    events, path = pages["patching"]
    start = next(e for e in events if isinstance(e, PatchingStarted))
    rows = [e for e in events if isinstance(e, PatchingRow)]
    page = opened(open_page, path, "patching")
    assert f"clean {start.clean_diff:.2f}, corrupted {start.corrupted_diff:.2f}" in page.inner_text("#patch-head")
    assert f"positions {', '.join(map(str, start.differ))} differ" in page.inner_text("#patch-head")
    maps = page.locator(".pmap")
    assert [maps.nth(k).get_attribute("data-map") for k in range(maps.count())] == list(start.maps)
    note = page.inner_text("#patch-note")
    for k, kind in enumerate(start.maps):
        mine = {r.layer: r.recovered for r in rows if r.map == kind}
        cells = maps.nth(k).locator("td[title]")
        assert cells.count() == start.layers * len(start.clean_ids)
        # the top row is the last block; its cell at the last position
        value = mine[start.layers - 1][-1]
        cell = maps.nth(k).locator("tr").nth(0).locator("td").nth(len(start.clean_ids) - 1)
        assert cell.get_attribute("title").endswith(f"block {start.layers - 1} · position {len(start.clean_ids) - 1}"
                                                    f" {visible_token_text(start.clean_tokens[-1])} · recovered "
                                                    f"{short(value)}")
        expected = diverging_colormap().map((max(-1.0, min(1.0, value)) + 1) / 2, mode="qcolor")
        assert close(rgb_of(cell.evaluate("el => getComputedStyle(el).backgroundColor")),
                     (expected.red(), expected.green(), expected.blue()))
        best = max(v for row in mine.values() for v in row)
        assert f"{len(mine)}/{start.layers} blocks" in note and f"most recovered {short(best):.2f}" in note


@pytest.mark.parametrize("kind", ["steering", "kirchenbauer", "dla", "salience", "patching"])
def test_each_page_is_small_and_fits_a_phone(pages, open_page, kind):
    _events, path = pages[kind]
    assert path.stat().st_size < 40_000
    section = {"kirchenbauer": "watermark"}.get(kind, kind)
    page = opened(open_page, path, section, width=390)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    box = page.locator(f"#{section}-section").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
