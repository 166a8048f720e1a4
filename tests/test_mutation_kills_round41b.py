"""Tests written to kill the survivors of the mutation run over the watermark maths, direct logit attribution and
salience (issue 28, point 4): each names the bug it catches."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import SynthIDTextWatermarkLogitsProcessor, WatermarkLogitsProcessor

from playground.config.samplers.watermark import WatermarkSettings
from playground.watermarking import GreenLists, KirchenbauerKey, SynthID, SynthIDKey, synthid_key
from playground.watermarking.detect import DetectionError, detect_kirchenbauer, detect_synthid, synthid_mask

VOCAB = 320
KEYS = (654, 400, 836, 123, 340)


def _theirs_synthid(ngram_len=3, table=2**16, skip=False, history=1024):
    return SynthIDTextWatermarkLogitsProcessor(ngram_len=ngram_len, keys=list(KEYS), sampling_table_size=table,
                                               sampling_table_seed=0, context_history_size=history, device="cpu",
                                               skip_first_ngram_calls=skip)


def _ours_synthid(ngram_len=3, table=2**16, skip=False, history=1024):
    return SynthID(SynthIDKey(keys=KEYS, ngram_len=ngram_len, sampling_table_size=table,
                              context_history_size=history, skip_first_ngram_calls=skip))


# --- Kirchenbauer green lists ------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["lefthash", "selfhash"])
def test_the_masks_apply_returns_are_the_tokens_transformers_raises(scheme):
    """Kills: a row's mask returned as None (lefthash and selfhash), a float mask (selfhash), the context-length
    check off by one (``<=``: a context exactly ``context_width`` long left unwatermarked), and one None per vocab
    entry instead of per row for a short context."""
    width = 2
    theirs = WatermarkLogitsProcessor(vocab_size=VOCAB, device="cpu", greenlist_ratio=0.25, bias=2.0,
                                      hashing_key=15485863, seeding_scheme=scheme, context_width=width)
    ours = GreenLists(KirchenbauerKey(vocab_size=VOCAB, seeding_scheme=scheme, context_width=width))
    ids = torch.tensor([[5, 17], [200, 3]])  # exactly context_width tokens: transformers already watermarks
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0))
    expected = theirs(ids, logits.clone())
    got, masks = ours.apply(ids, logits)
    assert torch.equal(got, expected)
    for row in range(2):
        raised = (expected[row] - logits[row]) > 0  # the tokens transformers gave the bias
        assert raised.any()
        assert masks[row] is not None and masks[row].dtype == torch.bool
        assert torch.equal(masks[row], raised)
    short_out, short_masks = ours.apply(ids[:, :1], logits)
    assert torch.equal(short_out, logits) and short_masks == [None, None]


@pytest.mark.parametrize("scheme", ["lefthash", "selfhash"])
def test_a_bias_float32_cannot_hold_is_added_in_float64(scheme):
    """Kills: the bias vector or the selfhash mask left without the logits' dtype (a float32 0.1 added to float64
    logits is not transformers' 0.1)."""
    theirs = WatermarkLogitsProcessor(vocab_size=VOCAB, device="cpu", greenlist_ratio=0.25, bias=0.1,
                                      hashing_key=15485863, seeding_scheme=scheme, context_width=1)
    ours = GreenLists(KirchenbauerKey(vocab_size=VOCAB, bias=0.1, seeding_scheme=scheme))
    ids = torch.tensor([[5, 17]])
    logits = torch.randn(1, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    got, _ = ours.apply(ids, logits)
    assert got.dtype == torch.float64 and torch.equal(got, theirs(ids, logits.clone()))


def test_green_ids_are_transformers_in_its_order():
    """Kills: ``ids`` (no caller in the package yet, so no other test reaches it) drawn without the seed's generator,
    over another vocabulary, or cut at another size. Against transformers' ``_get_greenlist_ids``."""
    theirs = WatermarkLogitsProcessor(vocab_size=VOCAB, device="cpu", greenlist_ratio=0.25, bias=2.0,
                                      hashing_key=15485863, seeding_scheme="lefthash", context_width=1)
    ours = GreenLists(KirchenbauerKey(vocab_size=VOCAB))
    for window in ([5], [17, 200], [3]):
        expected = theirs._get_greenlist_ids(torch.tensor(window))
        assert torch.equal(ours.ids(ours.seed(window)), expected)


# --- SynthID -----------------------------------------------------------------------------------------------------

def test_synthid_key_takes_every_setting():
    """Kills: the table size, the table seed or the context history dropped from the key built from the settings."""
    settings = WatermarkSettings(keys="5, 6, 7", ngram_len=4, sampling_table_size=1000, sampling_table_seed=9,
                                 context_history_size=12, skip_first_ngram_calls=True)
    assert synthid_key(settings) == SynthIDKey(keys=(5, 6, 7), ngram_len=4, sampling_table_size=1000,
                                               sampling_table_seed=9, context_history_size=12,
                                               skip_first_ngram_calls=True)


@pytest.mark.parametrize("table", [1000, 1023])
def test_a_table_not_a_power_of_two_is_indexed_by_the_remainder(table):
    """Kills: the fast path's mask taken for a table whose size is not a power of two (or 2^k − 1), the slow path's
    arguments dropped, its dtype lost, and a true division in place of the remainder. Against the processor."""
    theirs, ours = _theirs_synthid(table=table), _ours_synthid(table=table)
    prompt = [11, 12, 13]
    ids = torch.tensor([prompt])
    generator = torch.Generator().manual_seed(4)
    for token in [20, 21, 22, 23, 24]:
        logits = torch.randn(1, VOCAB, generator=generator) * 2
        got, did = ours.apply(ids, logits, start=len(prompt))
        assert did
        torch.testing.assert_close(got, theirs(ids, logits), rtol=1e-5, atol=1e-6)
        assert got.dtype == logits.dtype
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    many = torch.randint(0, VOCAB, (1, 30), generator=generator)
    assert torch.equal(ours.g_values(many), theirs.compute_g_values(many))


def test_g_values_of_a_batch_are_the_processors():
    """Kills: the contexts' hash started from ones of the wrong shape (``shape[:1]``, ``shape[:-2]``), which a batch
    of one broadcasts away."""
    theirs, ours = _theirs_synthid(ngram_len=4), _ours_synthid(ngram_len=4)
    ids = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(1))
    assert torch.equal(ours.g_values(ids), theirs.compute_g_values(ids))


def test_the_tournament_keeps_float64():
    """Kills: the g-values taken in the table's integer dtype (their sums then round in float32). The reference
    is the tournament written out in float64 on the processor's own g-values."""
    theirs, ours = _theirs_synthid(), _ours_synthid()
    ids = torch.tensor([[11, 12, 13, 7, 8]])
    logits = torch.randn(1, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    got, did = ours.apply(ids, logits, start=3)
    assert did and got.dtype == torch.float64
    context = [7, 8]
    probs = logits[0].softmax(-1)
    g = torch.stack([theirs.compute_g_values(torch.tensor([[*context, t]]))[0, 0] for t in range(VOCAB)]).double()
    for layer in range(len(KEYS)):
        probs = probs * (1 + g[:, layer] - (g[:, layer] * probs).sum())
    torch.testing.assert_close(got[0], probs.log(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("skip", [False, True], ids=["every-call", "skip-first"])
def test_zero_contexts_and_skipped_calls_enter_the_history_as_the_processors(skip):
    """Kills: which calls enter the history (``first`` None, 0 or ``ngram_len − 1`` whatever the setting, off by one)
    and a skipped call reported as acted. Generated zeros make a later context equal the zero-padded first ones,
    so the history's start decides whether the tournament acts; ``did`` must say whether the processor changed
    the logits."""
    theirs, ours = _theirs_synthid(ngram_len=3, skip=skip), _ours_synthid(ngram_len=3, skip=skip)
    prompt = [11, 12, 13]
    ids = torch.tensor([prompt])
    generator = torch.Generator().manual_seed(5)
    acted = []
    for token in [0, 0, 0, 9, 0, 0, 4]:
        logits = torch.randn(1, VOCAB, generator=generator)
        expected = theirs(ids, logits.clone())
        got, did = ours.apply(ids, logits, start=len(prompt))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        assert did == (not torch.equal(expected, logits))
        acted.append(did)
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    assert any(acted) and not all(acted)


def test_generation_contexts_of_unigrams_are_empty_rows():
    """Kills: the ``ngram_len`` 1 branch's shape (one empty context per step so far and one for the next)."""
    ours = _ours_synthid(ngram_len=1)
    contexts = ours.generation_contexts(torch.tensor([[3, 4, 5, 6, 7]]), start=2)
    assert tuple(contexts.shape) == (4, 0)


# --- SynthID detection -------------------------------------------------------------------------------------------

def _ids():
    return [3, 4, 5, 6, 3, 4, 5, 9, 10, 11, 3, 4, 2, 6, 200, 201, 17, 18, 19, 20, 21]


@pytest.mark.parametrize("eos", [2, 250])  # one in the text, one absent
def test_synthid_detection_masks_everything_from_the_first_eos(eos):
    """Kills: the EOS mask (its comparison, its row, its start, its fill, ``|`` for ``&``, its offset) and the
    detector calling the mask without the EOS id. Against the processor's own masks, as its detector combines
    them."""
    theirs, ours = _theirs_synthid(ngram_len=3, history=6), _ours_synthid(ngram_len=3, history=6)
    ids = torch.tensor([_ids()])
    expected = theirs.compute_context_repetition_mask(ids) & theirs.compute_eos_token_mask(ids, eos)[:, 2:]
    got = synthid_mask(ours, ids, eos)
    assert got.dtype == torch.bool and torch.equal(got, expected.bool())
    detection = detect_synthid(ours, _ids(), VOCAB, eos_id=eos)
    assert detection.scored == int(expected.sum())
    if eos == 2:
        assert detection.scored < int(theirs.compute_context_repetition_mask(ids).sum())  # precondition: it cut


def test_synthid_detections_colours_p_value_and_threshold():
    """Kills: the colours (None, written at ``width − j``, or shifted by a wrong width), the p-value and threshold
    left out, the default threshold changed, and the entropy filter applied without a threshold."""
    theirs, ours = _theirs_synthid(ngram_len=3), _ours_synthid(ngram_len=3)
    ids = _ids()
    detection = detect_synthid(ours, ids, VOCAB, entropies=[0.5] * len(ids))
    g = theirs.compute_g_values(torch.tensor([ids]))[0].double().mean(dim=1)
    mask = theirs.compute_context_repetition_mask(torch.tensor([ids]))[0].bool()
    expected = [None, None] + [float(g[j]) if mask[j] else None for j in range(len(ids) - 2)]
    assert detection.colours == tuple(expected)
    assert detection.threshold == 4.0
    assert detection.p_value == pytest.approx(0.5 * math.erfc(detection.z_score / math.sqrt(2)), rel=1e-12)
    assert detect_synthid(ours, ids, VOCAB, entropy_threshold=1.0).scored == int(mask.sum())  # no entropies


def test_synthid_sweet_scores_the_tokens_at_or_above_the_threshold():
    """Kills: the SWEET filter skipped, inverted (``or``, ``is None``, ``|``), its threshold compared against 1 or
    strictly, and its entropies misread or read in float32."""
    theirs, ours = _theirs_synthid(ngram_len=3), _ours_synthid(ngram_len=3)
    ids = _ids()
    entropies = [0.25 * (i % 5) for i in range(len(ids))]  # 0 … 1 in quarters, several exactly at the threshold
    threshold = 0.5
    entropies[4] = threshold - 1e-9  # below it by less than float32 can tell: dropped
    mask = theirs.compute_context_repetition_mask(torch.tensor([ids]))[0].bool()
    keep = [bool(mask[j]) and entropies[j + 2] >= threshold for j in range(len(ids) - 2)]
    assert any(entropies[j + 2] == threshold for j in range(len(keep)) if mask[j])  # precondition: ties
    detection = detect_synthid(ours, ids, VOCAB, entropies=entropies, entropy_threshold=threshold)
    assert detection.scored == sum(keep)
    assert [c is not None for c in detection.colours[2:]] == keep


def test_synthid_detection_of_short_texts():
    """Kills: the too-short check off by one (a text of ``ngram_len − 1`` tokens reaches the unfold), its message
    (None, the count to write), one scored token refused, and the message when nothing is left."""
    ours = _ours_synthid(ngram_len=3)
    with pytest.raises(DetectionError, match=r"too short to score: 2 token\(s\).* write at least 3$"):
        detect_synthid(ours, [5, 6], VOCAB)
    one = detect_synthid(ours, [5, 6, 7], VOCAB)
    assert one.scored == 1
    with pytest.raises(DetectionError, match=r"^no token is left to score: every context repeats, an EOS comes "
                                             r"first, or SWEET's entropy threshold keeps none; use a longer text "
                                             r"or lower the threshold$"):
        detect_synthid(ours, [5, 6, 7, 8], VOCAB, eos_id=5)


# --- Scoring a text (engine/watermark/score.py) -----------------------------------------------------------------

TEXT = "the quick brown fox jumps over the lazy dog and then  runs far away from the farm"  # a double space: ""


def _hand_entropies(lm, ids, bos):
    context = ([bos] if bos is not None else []) + list(ids)
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([context])).logits[0].double()
    p = logits.softmax(-1)
    bits = [float(-(q[q > 0] * q[q > 0].log2()).sum()) for q in p]
    return bits[: len(ids)] if bos is not None else [math.inf, *bits[: len(ids) - 1]]


def test_text_entropies_with_and_without_bos(tiny_lm):
    """Kills: the BOS dropped or doubled, the entropy in nats or of the wrong rows, the no-BOS branch's ``inf`` and
    shift. Against −Σ p log2 p from the model's own logits."""
    import copy
    import dataclasses

    from playground.engine.watermark.score import text_entropies
    from playground.watermarking.text import encode

    ids = encode(tiny_lm.tokenizer, TEXT)
    assert ids == tiny_lm.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    bos = tiny_lm.tokenizer.bos_token_id
    assert bos is not None
    assert text_entropies(tiny_lm, ids) == pytest.approx(_hand_entropies(tiny_lm, ids, bos), rel=1e-4)
    tokenizer = copy.deepcopy(tiny_lm.tokenizer)
    tokenizer.bos_token = None
    plain = dataclasses.replace(tiny_lm, tokenizer=tokenizer)
    got = text_entropies(plain, ids)
    assert got[0] == math.inf and len(got) == len(ids)
    assert got[1:] == pytest.approx(_hand_entropies(tiny_lm, ids, None)[1:], rel=1e-4)


def test_detect_ids_passes_every_setting_to_its_scheme():
    """Kills: the threshold, EOS, entropies, SWEET threshold or ``ignore_repeated_ngrams`` not passed on, the
    scheme's test inverted, and the refusal's message. Against the detectors called with keys built by hand."""
    from playground.watermarking.text import detect_ids

    ids = [7, 8, 9] * 6 + [2, 30, 31, 32, 33]
    entropies = [0.25 * (i % 5) for i in range(len(ids))]
    g = WatermarkSettings(watermark="kirchenbauer", greenlist_ratio=0.5, z_threshold=1.5,
                          ignore_repeated_ngrams=True, entropy_threshold=0.5)
    lists = GreenLists(KirchenbauerKey(vocab_size=VOCAB, greenlist_ratio=0.5))
    want = detect_kirchenbauer(lists, ids, threshold=1.5, ignore_repeated_ngrams=True, entropies=entropies,
                               entropy_threshold=0.5)
    assert detect_ids(g, ids, VOCAB, entropies=entropies) == want
    assert detect_kirchenbauer(lists, ids, threshold=1.5, entropies=entropies,
                               entropy_threshold=0.5).scored != want.scored  # precondition: repeats matter
    s = WatermarkSettings(watermark="synthid", keys="5, 6, 7", ngram_len=3, z_threshold=1.5, entropy_threshold=0.5)
    wm = SynthID(SynthIDKey(keys=(5, 6, 7), ngram_len=3))
    want = detect_synthid(wm, ids, VOCAB, threshold=1.5, eos_id=2, entropies=entropies, entropy_threshold=0.5)
    assert detect_ids(s, ids, VOCAB, entropies=entropies, eos_id=2) == want
    assert want.scored != detect_synthid(wm, ids, VOCAB, entropies=entropies, entropy_threshold=0.5).scored
    with pytest.raises(DetectionError, match=r"^choose a watermark to detect: --watermark kirchenbauer or synthid$"):
        detect_ids(WatermarkSettings(watermark="off"), ids, VOCAB)


def test_detect_text_uses_entropies_only_for_sweet(tiny_lm):
    """Kills: the entropies skipped under SWEET or asked for without it, and the wrong vocabulary."""
    import dataclasses

    from playground.engine.watermark.score import detect_text

    g = WatermarkSettings(watermark="kirchenbauer", greenlist_ratio=0.5)
    ids = tiny_lm.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    lists = GreenLists(KirchenbauerKey(vocab_size=tiny_lm.model.config.vocab_size, greenlist_ratio=0.5))
    assert detect_text(tiny_lm, g, TEXT) == detect_kirchenbauer(lists, ids)
    entropies = _hand_entropies(tiny_lm, ids, tiny_lm.tokenizer.bos_token_id)
    ranked = sorted(entropies)
    cut = (ranked[len(ranked) // 2 - 1] + ranked[len(ranked) // 2]) / 2  # between two: float32 cannot tip it
    assert ranked[len(ranked) // 2] - ranked[len(ranked) // 2 - 1] > 1e-3
    sweet = detect_text(tiny_lm, dataclasses.replace(g, entropy_threshold=cut), TEXT)
    assert sweet.scored == sum(1 for e in entropies[1:] if e >= cut)


@pytest.mark.parametrize(("threshold", "passes"), [(0.0, 0), (0.5, 1), (2.0, 1)])
def test_detect_text_runs_the_entropy_pass_only_for_sweet(tiny_lm, threshold, passes):
    """Kills: the teacher-forced pass run without SWEET (its entropies unused, a forward pass wasted on every
    keystroke) or skipped for a threshold at or below 1 bit. Counted with a forward hook on the real model."""
    from playground.engine.watermark.score import detect_text

    calls = []
    handle = tiny_lm.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        detect_text(tiny_lm, WatermarkSettings(watermark="kirchenbauer", entropy_threshold=threshold), TEXT)
    finally:
        handle.remove()
    assert len(calls) == passes


def test_replace_every_changes_exactly_every_kth_word():
    """Kills: the stride, its start, the empty-word check, the count, the seed and a replacement equal to the
    word it replaces (checked word by word, not by redoing the draw)."""
    from playground.watermarking.text import REPLACEMENTS, replace_every

    words = TEXT.split(" ")
    assert replace_every(TEXT, 0) == (TEXT, 0) and replace_every(TEXT, -1) == (TEXT, 0)
    for k in (1, 3, 4):
        edited, changed = replace_every(TEXT, k, seed=1)
        out = edited.split(" ")
        assert len(out) == len(words)
        hit = [i for i in range(len(words)) if i % k == k - 1 and words[i]]
        assert changed == len(hit)
        for i, (before, after) in enumerate(zip(words, out, strict=True)):
            if i in hit:
                assert after in REPLACEMENTS and after != before, (k, i)
            else:
                assert after == before, (k, i)
    draws = {replace_every(TEXT, 1, seed=s)[0] for s in range(4)}
    assert len(draws) == 4 and replace_every(TEXT, 2, seed=3) == replace_every(TEXT, 2, seed=3)
    assert replace_every(TEXT, 2) == replace_every(TEXT, 2, seed=0)


def test_delete_span_deletes_the_middle_share():
    """Kills: the share's rounding, the span's start and the words kept after it."""
    from playground.watermarking.text import delete_span

    text = " ".join(f"w{i}" for i in range(10))
    assert delete_span(text, 0.3) == ("w0 w1 w2 w6 w7 w8 w9", 3)
    assert delete_span(text, 0.5) == ("w0 w1 w7 w8 w9", 5)
    assert delete_span(text, 0.25) == ("w0 w1 w2 w3 w6 w7 w8 w9", 2)  # round half to even
    assert delete_span(text, 0.0) == (text, 0)


def test_edit_rows_and_their_dict():
    """Kills: the rows' names, order, counts and fields, a refused edit kept, and the dict's keys and rounding."""
    from playground.engine.watermark.score import EditRow

    row = EditRow("replace 1 word in 3", 4, 12, 1.234567, 0.01, 9, False)
    assert row.as_dict() == {"edit": "replace 1 word in 3", "words_changed": 4, "words": 12,
                             "share_changed": round(4 / 12, 4), "z_score": 1.2346, "p_value": 0.01, "scored": 9,
                             "detected": False}
    assert EditRow("x", 0, 0, 0.0, 1.0, 0, False).as_dict()["share_changed"] == 0.0
    assert EditRow("x", 1, 1, 0.0, 1.0, 0, False).as_dict()["share_changed"] == 1.0  # one word, changed


def test_edit_budget_scores_each_edit(tiny_lm):
    """Kills: the edits' names and order, the counts and scores a row carries, and a text too short kept as a row.
    Against the detector on each edited text's own ids."""
    from playground.engine.watermark.score import edit_budget
    from playground.watermarking.text import delete_span, replace_every

    g = WatermarkSettings(watermark="kirchenbauer", greenlist_ratio=0.5, z_threshold=0.0)
    vocab = tiny_lm.model.config.vocab_size
    lists = GreenLists(KirchenbauerKey(vocab_size=vocab, greenlist_ratio=0.5))
    rows = edit_budget(tiny_lm, g, TEXT, seed=2)
    names = ["as generated", *(f"replace 1 word in {k}" for k in (12, 8, 6, 5, 4, 3, 2, 1)),
             "delete the middle 10%", "delete the middle 25%", "delete the middle 50%"]
    assert [r.edit for r in rows] == names
    edited = [replace_every(TEXT, k, 2) for k in (0, 12, 8, 6, 5, 4, 3, 2, 1)]
    edited += [delete_span(TEXT, s) for s in (0.1, 0.25, 0.5)]
    words = len(TEXT.split(" "))
    for row, (text, changed) in zip(rows, edited, strict=True):
        d = detect_kirchenbauer(lists, tiny_lm.tokenizer(text, add_special_tokens=False)["input_ids"], threshold=0.0)
        assert (row.words_changed, row.words, row.scored) == (changed, words, d.scored)
        assert (row.z_score, row.p_value, row.detected) == (d.z_score, d.p_value, d.prediction)
    by_default = [(r.words_changed, r.z_score) for r in edit_budget(tiny_lm, g, TEXT)]  # seed 0
    assert by_default[:9] == [(c, detect_kirchenbauer(lists, tiny_lm.tokenizer(t, add_special_tokens=False)
                                                      ["input_ids"]).z_score)
                              for t, c in (replace_every(TEXT, k, 0) for k in (0, 12, 8, 6, 5, 4, 3, 2, 1))]
    assert by_default != [(r.words_changed, r.z_score) for r in rows]  # precondition: the seed matters
    assert len(tiny_lm.tokenizer("a", add_special_tokens=False)["input_ids"]) == 1  # too short to score
    assert [r.edit for r in edit_budget(tiny_lm, g, "a")] == ["replace 1 word in 1"]  # only the replaced word scores


# --- Direct logit attribution's run wrapper (engine/dla/run.py) -------------------------------------------------

def _dla_run(tiny_lm, **values):
    from playground.config import RunSettings
    from playground.engine.strategies import run_strategy
    from playground.events import RunStarted, TokenStep

    events = list(run_strategy(tiny_lm, RunSettings.from_flat(prompt="Hello there, tell me", strategy="greedy",
                                                              max_new_tokens=3, **values)))
    prompt = next(e for e in events if isinstance(e, RunStarted)).prompt_token_ids
    return events, list(prompt), [e.token_id for e in events if isinstance(e, TokenStep)]


def test_attribution_against_a_named_token_is_its_logit_difference(tiny_lm):
    """Kills: ``--attribute-against`` dropped anywhere on its way (the wrapper, the run, each request) or kept for
    a step whose own token it is. Against the model's logits by hand."""
    from playground.events.dla import LogitAttribution

    tok = tiny_lm.tokenizer
    word = tok.decode([tok.encode(" Paris", add_special_tokens=False)[0]])
    (against,) = tok.encode(word, add_special_tokens=False)
    events, prompt, tokens = _dla_run(tiny_lm, attribute_steps="all", attribute_against=word)
    found = [e for e in events if isinstance(e, LogitAttribution)]
    assert [a.step for a in found] == [0, 1, 2] and against not in tokens
    with torch.no_grad():
        logits = tiny_lm.model(input_ids=torch.tensor([prompt + tokens])).logits[0].double()
    for a in found:
        row = logits[len(prompt) + a.step - 1]
        assert a.against_id == against
        assert a.difference == pytest.approx(float(row[a.token_id] - row[against]), abs=1e-4)
    # the step's own token as the alternative: its runner-up instead
    own = tok.decode([tokens[0]])
    if tok.encode(own, add_special_tokens=False) == [tokens[0]]:
        events, _, again = _dla_run(tiny_lm, attribute_steps="0", attribute_against=own)
        (a,) = [e for e in events if isinstance(e, LogitAttribution)]
        assert again == tokens and a.against_id != tokens[0]
        assert a.against_id == int(logits[len(prompt) - 1].topk(2).indices[1])


def test_steps_past_the_run_are_reported_not_attributed(tiny_lm):
    """Kills: a step equal to the run's length taken as one of its steps (``<=``) or not reported (``>``), the
    report's text, and an empty choice attributed anyway (``and`` for ``or``)."""
    from playground.events.dla import AttributionMissing, LogitAttribution

    events, _, tokens = _dla_run(tiny_lm, attribute_steps="0, 3")
    assert len(tokens) == 3
    assert [a.step for a in events if isinstance(a, LogitAttribution)] == [0]
    assert [m.what for m in events if isinstance(m, AttributionMissing)] == [
        "nothing to attribute for step 3 (the run has 3 steps)"]
    events, _, _ = _dla_run(tiny_lm, attribute_steps="7")
    assert not [a for a in events if isinstance(a, LogitAttribution)]
    assert [m.what for m in events if isinstance(m, AttributionMissing)] == [
        "nothing to attribute for step 7 (the run has 3 steps)"]


def test_a_word_of_several_tokens_is_refused_with_its_pieces(tiny_lm):
    """Kills: the refusal's pieces and its hint."""
    from playground.config.errors import ConfigError
    from playground.engine.dla.run import single_token

    tok = tiny_lm.tokenizer
    word = " Shanghai coffee"
    pieces = [tok.decode([i]) for i in tok.encode(word, add_special_tokens=False)]
    assert len(pieces) > 1
    message = (f"--attribute-against {word!r} is {len(pieces)} tokens for this model ({pieces}): give a single "
               "token, e.g. with its leading space (' Lyon')")
    with pytest.raises(ConfigError) as refused:
        single_token(tiny_lm, word, "--attribute-against")
    assert str(refused.value) == message
