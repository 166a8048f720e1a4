"""Track a token in the window: the plotted raw and processed probabilities and ranks equal the ones the test
computes from the model's logits at the run's tokens (teacher forcing) where the step recorded the token, and
"below rank N" bounds elsewhere (at most the N-th candidate's probability)."""

from __future__ import annotations

import pytest
import torch
from windows import let_go, open_window

from playground.config import RunSettings

WAIT_MS = 30000
TEMPERATURE = 1.5
N = 5


def reference(lm, prompt_ids, token_ids):
    """raw probs, processed (temperature) probs and raw ranks at each step, over the vocabulary: [steps, vocab]."""
    ids = torch.tensor([list(prompt_ids) + list(token_ids)])
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0, len(prompt_ids) - 1: -1].float()
    ranks = (logits.unsqueeze(1) > logits.unsqueeze(2)).sum(-1) + 1  # [steps, vocab]: tokens likelier than each
    return logits.softmax(-1), (logits / TEMPERATURE).softmax(-1), ranks


def test_tracked_token_values_equal_the_models(qtbot, tiny_lm, tmp_path):
    # Only the chart's N candidates recorded (no raw candidates for the what-if): exact there, bounds elsewhere.
    settings = RunSettings(prompt="one two three", chat=False, strategy="sample", temperature=TEMPERATURE, seed=5,
                           max_new_tokens=10, num_candidates=N, record_candidates=0)
    w = open_window(qtbot, tmp_path, tiny_lm, settings)
    try:
        w.generate()
        qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
        run = w.session.selected
        tokens = [s.token_id for s in run.steps]
        raw, processed, ranks = reference(tiny_lm, run.started.prompt_token_ids, tokens)
        # A token in the top N at some steps and below it at others.
        in_top = (ranks <= N)
        mixed = torch.nonzero(in_top.any(0) & ~in_top.all(0)).flatten().tolist()
        token = next(t for t in mixed if t not in tokens)
        view = w.views["track"]
        view.track(str(token))
        x, y = view.raw_curve.getData()
        xp, yp = view.processed_curve.getData()
        xr, yr = view.rank_curve.getData()
        bx, by = view.raw_bound.getData()
        rbx, rby = view.rank_bound.getData()
        below_steps, exact_steps = [], []
        for i in range(len(tokens)):
            if ranks[i, token] <= N:
                exact_steps.append(i)
                j = list(x).index(i)
                assert 10 ** y[j] == pytest.approx(float(raw[i, token]), rel=1e-4)
                assert 10 ** yp[list(xp).index(i)] == pytest.approx(float(processed[i, token]), rel=1e-4)
                assert round(10 ** yr[list(xr).index(i)]) == int(ranks[i, token])
            else:
                below_steps.append(i)
                # drawn at most the N-th likeliest token's raw probability, which the token is below
                nth = float(raw[i].sort(descending=True).values[N - 1])
                j = list(bx).index(i)
                assert 10 ** by[j] == pytest.approx(nth, rel=1e-4) and float(raw[i, token]) <= nth
        assert list(x) == exact_steps == list(xr) == list(xp)
        assert below_steps and list(bx) == below_steps and list(rbx) == below_steps
        assert all(10 ** v == pytest.approx(N + 1) for v in rby)
        assert f"below rank {N}" in view.note.text()
        view.resize(900, 520)
        view.grab().save(str(tmp_path / "track.png"))
        assert f"exact at {len(tokens) - len(below_steps)} of {len(tokens)}" in view.note.text()

        # A word typed with its leading space: the tokenizer's first token of it.
        word_ids = tiny_lm.tokenizer.encode(" the", add_special_tokens=False)
        view.track(" the")
        assert view.token_id == word_ids[0]
        view.track("the")
        assert view.token_id == tiny_lm.tokenizer.encode("the", add_special_tokens=False)[0]
        assert view.note.text().startswith(f"Tracking token {view.token_id} ")
    finally:
        let_go(w)


RECORDED = 64  # raw candidates packed per step for the what-if


def test_a_token_among_the_what_ifs_raw_candidates_has_its_raw_probability_and_rank(qtbot, tiny_lm, tmp_path):
    """With raw candidates recorded, the raw probability and rank are exact down to rank RECORDED (to the packing's
    1/1024 nat); the processed probability only where the chart's N candidates have it; a bound below that."""
    settings = RunSettings(prompt="one two three", chat=False, strategy="sample", temperature=TEMPERATURE, seed=5,
                           max_new_tokens=10, num_candidates=N, record_candidates=RECORDED)
    w = open_window(qtbot, tmp_path, tiny_lm, settings)
    try:
        w.generate()
        qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
        run = w.session.selected
        tokens = [s.token_id for s in run.steps]
        raw, _, ranks = reference(tiny_lm, run.started.prompt_token_ids, tokens)
        # A token within the recorded ranks at some steps and below them at others, never in the chart's N.
        inside = ranks <= RECORDED
        token = next(t for t in torch.nonzero(inside.any(0) & ~inside.all(0) & (ranks > N).all(0)).flatten().tolist()
                     if t not in tokens)
        view = w.views["track"]
        view.track(str(token))
        x, y = view.raw_curve.getData()
        xr, yr = view.rank_curve.getData()
        xp, _ = view.processed_curve.getData()
        bx, by = view.raw_bound.getData()
        exact = [i for i in range(len(tokens)) if ranks[i, token] <= RECORDED]
        below = [i for i in range(len(tokens)) if i not in exact]
        assert list(x) == exact == list(xr) and (xp is None or len(xp) == 0) and list(bx) == below
        for j, i in enumerate(exact):
            assert 10 ** y[j] == pytest.approx(float(raw[i, token]), rel=2e-3)
            assert round(10 ** yr[j]) == int(ranks[i, token])
        for j, i in enumerate(bx):
            nth = float(raw[int(i)].sort(descending=True).values[RECORDED - 1])
            assert 10 ** by[j] == pytest.approx(nth, rel=2e-3)
    finally:
        let_go(w)
