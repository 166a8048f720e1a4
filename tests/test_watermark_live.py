"""A watermarked run end to end on the tiny model: greedy with green lists is transformers' ``generate`` with its
``WatermarkingConfig``, token for token; the live record's colours and final z-score are transformers'
``WatermarkDetector``'s on the run's ids (SynthID's: its processor's g-values); the view draws what the events say."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers import SynthIDTextWatermarkLogitsProcessor, WatermarkDetector, WatermarkingConfig

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import RunStarted, TokenStep
from playground.events.watermark import WatermarkStarted, WatermarkStep

PROMPT = dict(prompt="Hello there, tell me", max_new_tokens=20, seed=3)


def _run(tiny_lm, **values):
    events = list(run_strategy(tiny_lm, RunSettings.from_flat(**PROMPT, **values)))
    start = next(e for e in events if isinstance(e, RunStarted))
    return events, start.prompt_token_ids, [e for e in events if isinstance(e, TokenStep)]


@pytest.fixture(scope="module")
def greedy_marked(tiny_lm):
    return _run(tiny_lm, strategy="greedy", watermark="kirchenbauer", bias=4.0, greenlist_ratio=0.5)


def test_greedy_green_lists_are_transformers_generate(tiny_lm, greedy_marked):
    _, prompt_ids, steps = greedy_marked
    config = WatermarkingConfig(greenlist_ratio=0.5, bias=4.0)
    with torch.no_grad():
        out = tiny_lm.model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=20,
                                     watermarking_config=config, pad_token_id=0)
    theirs = out[0, len(prompt_ids):].tolist()
    ours = [s.token_id for s in steps]
    n = min(len(theirs), len(ours))
    assert n >= 5 and ours[:n] == theirs[:n]
    _, _, plain = _run(tiny_lm, strategy="greedy")
    assert [s.token_id for s in plain] != ours  # precondition: the watermark changed the text


def test_live_score_is_transformers_detector_on_the_run(tiny_lm, greedy_marked):
    events, prompt_ids, steps = greedy_marked
    marks = [e for e in events if isinstance(e, WatermarkStep)]
    assert isinstance(next(e for e in events if isinstance(e, WatermarkStarted)), WatermarkStarted)
    assert [m.step for m in marks] == [s.step for s in steps]
    # The detector on the prompt's last token and the output: it scores exactly the generated tokens.
    ids = [prompt_ids[-1], *(s.token_id for s in steps)]
    detector = WatermarkDetector(tiny_lm.model.config, "cpu", WatermarkingConfig(greenlist_ratio=0.5, bias=4.0))
    theirs = detector(torch.tensor([ids]), return_dict=True)
    assert marks[-1].count == theirs.num_tokens_scored[0]
    assert math.isclose(marks[-1].z_score, float(theirs.z_score[0]), rel_tol=1e-9)
    assert sum(m.colour for m in marks) == theirs.num_green_tokens[0]
    # Entropy and KL at each step, from the model's own logits and transformers' processor.
    from transformers import WatermarkLogitsProcessor

    processor = WatermarkLogitsProcessor(vocab_size=tiny_lm.model.config.vocab_size, device="cpu",
                                         greenlist_ratio=0.5, bias=4.0)
    context = torch.tensor([[*prompt_ids, *(s.token_id for s in steps)]])
    with torch.no_grad():
        logits = tiny_lm.model(context).logits[0, len(prompt_ids) - 1: -1].float()
    for i, mark in enumerate(marks):
        logp = logits[i].double().log_softmax(-1)
        logq = processor(context[:, : len(prompt_ids) + i], logits[i: i + 1])[0].double().log_softmax(-1)
        kl = float((logq.exp() * (logq - logp)).sum())
        entropy = float(-(logp.exp() * logp).sum()) / math.log(2)
        assert mark.kl is not None and math.isclose(mark.kl, kl, rel_tol=1e-3, abs_tol=1e-5), i
        assert mark.entropy is not None and math.isclose(mark.entropy, entropy, rel_tol=1e-4), i


def test_synthid_live_g_values_are_the_processors(tiny_lm):
    events, _, steps = _run(tiny_lm, strategy="sample", watermark="synthid", ngram_len=2)
    marks = [e for e in events if isinstance(e, WatermarkStep)]
    keys = [654, 400, 836, 123, 340, 443, 597, 160, 57]
    processor = SynthIDTextWatermarkLogitsProcessor(ngram_len=2, keys=keys, sampling_table_size=2**16,
                                                    sampling_table_seed=0, context_history_size=1024, device="cpu")
    generated = torch.tensor([[s.token_id for s in steps]])
    g = processor.compute_g_values(generated)[0]  # the n-grams of the output: tokens from the second on
    assert [tuple(row) for row in g.tolist()] == [m.g_values for m in marks[1:]]
    # The running score counts the steps whose context was fresh (the tournament acted), as fair coins' z.
    scored = [sum(m.g_values) / len(keys) for m in marks if m.scored]
    assert 0 < len(scored) < len(marks)  # precondition: some contexts repeated (2-grams on a tiny model)
    mean = sum(scored) / len(scored)
    assert marks[-1].count == len(scored)
    assert math.isclose(marks[-1].z_score, (mean - 0.5) / math.sqrt(1 / (4 * len(scored) * len(keys))))


def test_the_view_draws_the_events_and_its_detector_scores_any_text(qtbot, tiny_lm, greedy_marked):
    from playground.config.samplers.watermark import WatermarkSettings
    from playground.engine.watermark.score import text_entropies
    from playground.state import Run, flowing_token_text
    from playground.ui.model_sources import LocalModel
    from playground.ui.views.watermark import WatermarkView
    from playground.watermarking.text import detect_ids, encode

    events, _, steps = greedy_marked
    view = WatermarkView()
    qtbot.addWidget(view)
    view.show_run(Run.from_events(events))
    marks = [e for e in events if isinstance(e, WatermarkStep)]
    assert view.text.toPlainText() == "".join(flowing_token_text(s.text) for s in steps)
    _, zs = view.z_curve.getData()
    assert list(zs) == pytest.approx([m.z_score for m in marks])
    assert f"{marks[-1].z_score:.2f}" in view.header.text()
    # The detector tab: any text, scored as you type (one window for both checks).
    panel = view.detector
    panel.set_model(tiny_lm.tokenizer, LocalModel(tiny_lm))  # as the window hands it its model source
    text = "".join(s.text for s in steps)
    panel.use_settings(WatermarkSettings(watermark="kirchenbauer", greenlist_ratio=0.5, bias=4.0), text)
    ids = encode(tiny_lm.tokenizer, text)
    g = WatermarkSettings(watermark="kirchenbauer", greenlist_ratio=0.5)
    expected = detect_ids(g, ids, tiny_lm.model.config.vocab_size)
    assert panel.last is not None and math.isclose(panel.last.z_score, expected.z_score)
    assert f"z = <b>{expected.z_score:.2f}</b>" in panel.result.text()
    # The edit budget: the z-score after each edit, plotted against the share of the words edited.
    from playground.watermarking.text import DELETE_SHARES, REPLACE_EVERY, delete_span, replace_every

    panel.threshold.setValue(2.5)  # the tiny model's short text scores z 3.2 as it is
    panel.edit_budget()
    words = len(text.split(" "))
    low = dataclasses.replace(g, z_threshold=2.5)
    want_replaced = [(changed / words, detect_ids(low, encode(tiny_lm.tokenizer, t), tiny_lm.model.config.vocab_size))
                     for t, changed in (replace_every(text, k) for k in REPLACE_EVERY)]
    xs, zs = panel.replaced_curve.getData()
    assert list(xs) == pytest.approx([x for x, _ in want_replaced])
    assert list(zs) == pytest.approx([d.z_score for _, d in want_replaced])
    xs, zs = panel.deleted_curve.getData()
    assert list(xs) == pytest.approx([round(words * share) / words for share in DELETE_SHARES])
    assert zs[0] == pytest.approx(detect_ids(g, encode(tiny_lm.tokenizer, delete_span(text, DELETE_SHARES[0])[0]),
                                             tiny_lm.model.config.vocab_size).z_score)
    assert panel.threshold_line.value() == 2.5 and panel.budget_plot.isVisible() == panel.isVisible()
    lost = next(k for k, (_, d) in zip(REPLACE_EVERY, want_replaced, strict=True) if not d.prediction)
    assert want_replaced[0][1].prediction and f"lost at <b>1 word in {lost}</b>" in panel.budget_label.text()
    panel.threshold.setValue(4.0)
    panel.input.setPlainText("a")  # typing: scored after the pause
    qtbot.waitUntil(lambda: "too short" in panel.result.text(), timeout=2000)
    panel.input.setPlainText(text)
    entropies = text_entropies(tiny_lm, ids)
    cut = round(sorted(entropies)[len(entropies) // 2], 2)  # SWEET at the median: about half the tokens count
    panel.sweet.setValue(cut)  # the entropies come from a background pass, then the score
    panel.score()
    assert "entropies" in panel.result.text()
    panel.wait_for_entropies()
    sweet = detect_ids(dataclasses.replace(g, entropy_threshold=cut), ids, tiny_lm.model.config.vocab_size,
                       entropies=entropies)
    assert panel.last is not None and panel.last.scored == sweet.scored < expected.scored


def test_greedy_speculation_keeps_the_green_lists(tiny_lm, greedy_marked):
    """Speculative decoding verifies each drafted token under the watermarked chain at its own context: greedy
    speculation writes the watermarked greedy text token for token."""
    _, _, steps = greedy_marked
    from playground.events import SpeculativeRound

    events, _, speculated = _run(tiny_lm, strategy="speculative", draft="prompt-lookup", prompt_lookup_ngram=1,
                                 watermark="kirchenbauer", bias=4.0, greenlist_ratio=0.5)
    assert [s.token_id for s in speculated] == [s.token_id for s in steps]
    assert sum(e.accepted for e in events if isinstance(e, SpeculativeRound)) > 0  # precondition: drafts were kept
