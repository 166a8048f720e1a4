"""The watermark in the what-if: an estimate at every step (the green tokens, or SynthID's g-values, of the
tokens outside the recorded candidates are not known). Kirchenbauer's bias is added to the recorded candidates
that are green (the ids seed it); SynthID leaves them as they were."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.config.samplers.watermark import WatermarkSettings
from playground.state.what_if.bounds import _Chain, reason
from playground.state.what_if.stages import stage

_UNKNOWN = reason("the watermark's green tokens (or g-values) outside the recorded candidates are not known")


@stage("watermark")
def _watermark(c: _Chain, s: RunSettings, context: np.ndarray, start: int, *_: object) -> None:
    g = s.group(WatermarkSettings)
    rows = c.x.shape[0]
    c.flag(np.ones(rows, dtype=bool), _UNKNOWN)
    if g.watermark != "kirchenbauer":
        return
    from playground.watermarking import GreenLists, kirchenbauer_key

    sizes = [st.raw_top.vocab_size for st in c.run.steps if st.raw_top is not None]
    vocab = sizes[0] if sizes else int(np.max(c.ids, initial=0)) + 1
    lists = GreenLists(kirchenbauer_key(g, vocab))
    bias = np.zeros(c.x.shape)
    for row in range(rows):
        end = start + row
        if end < g.context_width:
            continue
        window = [int(t) for t in context[max(0, end - g.context_width):end]]
        for j, token in enumerate(c.ids[row].tolist()):
            if 0 <= token < vocab and lists.is_green(window, int(token)):
                bias[row, j] = g.bias
    with np.errstate(invalid="ignore"):
        c.x = c.x + bias
