"""The tokens view's rank-bucket colouring (GLTR's top 1 / 10 / 100 / rest): each displayed token's background is
its bucket's colour for the raw rank the test computes from the model's logits, and the legend shows the buckets."""

from __future__ import annotations

import torch
from PySide6.QtGui import QColor, QTextCursor
from windows import let_go, open_window

from playground.config import RunSettings

RUN_TIMEOUT_MS = 30000


def test_rank_colouring_follows_the_ranks_computed_from_the_logits(qtbot, tiny_lm, tmp_path):
    from playground.ui.views.tokens.text import RANK_BUCKETS, SHADE_RANK

    settings = RunSettings(prompt="one two three", chat=False, strategy="sample", temperature=3.0, seed=3,
                           max_new_tokens=24)
    w = open_window(qtbot, tmp_path, tiny_lm, settings)
    try:
        w.generate()
        qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
        view = w.views["tokens"].token_view
        view.mode.setCurrentIndex(view.mode.findData(SHADE_RANK))
        assert view.legend.ranks and "rank" in view.caption.text()
        run = w.session.selected
        ids = list(run.started.prompt_token_ids) + [s.token_id for s in run.steps]
        with torch.no_grad():
            logits = tiny_lm.model(input_ids=torch.tensor([ids])).logits[0].float()
        n_prompt = len(run.started.prompt_token_ids)
        text = view.text
        seen = set()
        for i, step in enumerate(run.steps):
            row = logits[n_prompt - 1 + i]
            rank = int((row > row[step.token_id]).sum()) + 1
            bucket = next(b for b, (top, _, _) in enumerate(RANK_BUCKETS) if rank <= top)
            seen.add(bucket)
            cursor = QTextCursor(text.document())
            cursor.setPosition(text._starts[i] + 1)  # the format of the token's first character
            shown = cursor.charFormat().background().color()
            assert shown == QColor(RANK_BUCKETS[bucket][1]), (i, rank)
        assert len(seen) >= 3  # the run's tokens fall in several buckets
        w.views["tokens"].grab().save(str(tmp_path / "ranks.png"))
        # Back to probability shading: no token keeps a bucket colour.
        view.mode.setCurrentIndex(0)
        assert not view.legend.ranks
        bucket_colours = {QColor(c).name() for _, c, _ in RANK_BUCKETS}
        cursor = QTextCursor(text.document())
        cursor.setPosition(text._starts[0] + 1)
        assert cursor.charFormat().background().color().name() not in bucket_colours
    finally:
        let_go(w)
