"""What a what-if costs in the window (the tokens view's UI path, GUI thread), for a 1,000-step run: re-deriving
every step (``state/what_if.py``), then drawing it (the chart's step, the struck-through tokens of the output, the
strip) and painting the view. The run: a tiny random model (320-token vocabulary) decoding 1,000 tokens by
sampling (EOS biased away), each step recording its 256 likeliest raw tokens as a default-model run does. The
settings go into the form as a user's edits do; the debounce (DEBOUNCE_MS) is left out of the figures.
Medians of repeated changes.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/bench_what_if_window.py [--steps 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import support_path  # noqa: F401  (tests/support on sys.path)
from PySide6.QtWidgets import QApplication
from support.tiny_models import build_tiny_lm

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.state import Session
from playground.ui.controls import RunControls
from playground.ui.style import configure_pyqtgraph
from playground.ui.views.tokens import TokensView

CHANGES = {
    "top-k 40, temperature 0.8": dict(top_k=40, temperature=0.8),
    "top-p 0.9, min-p 0.05": dict(top_p=0.9, min_p=0.05),
    "repetition penalty 1.3, top-k 20": dict(repetition_penalty=1.3, top_k=20),
    "order top_p;temperature;top_k": dict(samplers="top_p;temperature;top_k", top_p=0.8),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    app = QApplication.instance() or QApplication([])
    configure_pyqtgraph()
    lm = build_tiny_lm(seed=0, max_positions=args.steps + 64)
    settings = RunSettings(prompt="one two three", chat=False, strategy="sample", seed=1, temperature=1.0,
                           max_new_tokens=args.steps, logit_bias=(f"{lm.tokenizer.eos_token_id}=-100",))  # no EOS
    session = Session()
    run = session.start_run(settings)
    start = time.perf_counter()
    for event in run_strategy(lm, settings):
        session.apply(event)
    session.end_live()
    print(f"decoded {len(run.steps)} steps in {time.perf_counter() - start:.1f} s (tiny model)")

    view = TokensView()
    form = RunControls(settings)
    view.form = form  # as the window's form (found through the window in the app)
    view.resize(1100, 560)
    view.show()
    view.show_run(run)
    app.processEvents()
    start = time.perf_counter()
    view.what_if_switch.setChecked(True)  # the first: unpacks the recorded candidates and the run's own chain
    app.processEvents()
    print(f"{'switch on (unpack once + re-derive + draw)':44s} {(time.perf_counter() - start) * 1000:7.1f} ms")
    for label, values in CHANGES.items():
        derive, draw, paint = [], [], []
        for i in range(args.repeat):
            form.set_run_settings(settings.replace(**values, seed=settings.seed + i % 2))
            start = time.perf_counter()
            view.refresh_what_if()
            view.repaint()  # the paint the change costs, now rather than at the next frame
            paint.append((time.perf_counter() - start) * 1000 - sum(view.what_if_ms.values()))
            derive.append(view.what_if_ms["derive"])
            draw.append(view.what_if_ms["draw"])
        d, w, p = (statistics.median(x) for x in (derive, draw, paint))
        print(f"{label:44s} re-derive {d:6.1f} ms  draw {w:5.1f} ms  paint {p:5.1f} ms  total {d + w + p:6.1f} ms")
    view.close()


if __name__ == "__main__":
    main()
