"""Does the window slow the decode? The same greedy run in a plain thread vs in the real window, side by side.

(a) plain: the engine generator consumed in a ``threading.Thread`` while the main thread idles in a Qt event loop;
(b) window: the same run started in the real ``MainWindow``, shown offscreen at 1500x950 so painting really happens.
Both wait by spinning a ``QEventLoop`` (never ``QTest.qWait``, which holds the GIL). Runs alternate (a, b, a, b, ...)
so machine noise hits both; each rate is the run's own decode-only ``RunFinished.tokens_per_s``. The GUI thread's
CPU time during each run is printed too: on a 2-core CPU every GUI millisecond is taken from the model's threads.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/bench_window.py [--max-new-tokens 1000] [--repeats 3]
    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/bench_window.py --tiny        # a quick smoke run
    ... --profile FILE   cProfile of the GUI thread's CPU time during the window runs (pstats file; the Python side)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import support_path  # noqa: F401  (tests/support on sys.path)
from side_by_side import report

from playground.config import ModelSettings, RunSettings
from playground.engine.strategies import run_strategy
from playground.events import RunFinished
from playground.ui import switch_interval

# Without the chat template the small model keeps telling its story instead of ending at EOS; greedy, it soon
# repeats itself in one long paragraph (here ~835 of 1,000 tokens), the case where a text view's work per token
# grows with the output.
PROMPT = "Once upon a time"
POLL_MS = 50


def spin_until(done) -> None:
    """Run a Qt event loop until ``done()`` is true (checked every POLL_MS); the GIL is free while it waits."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    timer = QTimer()
    timer.setInterval(POLL_MS)
    timer.timeout.connect(lambda: done() and loop.quit())
    timer.start()
    if not done():
        loop.exec()
    timer.stop()


def plain_thread_run(lm, settings: RunSettings) -> tuple[RunFinished, float]:
    """The run in a plain thread; the main thread idles in an event loop. Returns the final event, GUI CPU s."""
    result: list[RunFinished] = []

    def consume() -> None:
        result.extend(e for e in run_strategy(lm, settings) if isinstance(e, RunFinished))

    thread = threading.Thread(target=consume, name="plain-run")
    cpu = time.thread_time()
    thread.start()
    spin_until(lambda: not thread.is_alive())
    thread.join()
    return result[0], time.thread_time() - cpu


def window_run(window, settings: RunSettings, profiler=None) -> tuple[RunFinished, float]:
    """The run in the real window; waits until the window's job has ended. Returns the final event, GUI CPU s."""
    cpu = time.thread_time()
    if profiler is not None:
        profiler.enable()
    run = window.start_run(settings)
    spin_until(lambda: not window.busy)
    if profiler is not None:
        profiler.disable()
    assert run.finished is not None, f"the window's run did not finish: {run.error}"
    return run.finished, time.thread_time() - cpu


def make_window(lm, store_dir: str):
    from PySide6.QtCore import QSettings

    from playground.ui.main_window import MainWindow

    store = QSettings(str(Path(store_dir) / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(store=store)
    window.resize(1500, 950)
    window.show()
    window.set_model(lm)
    spin_until(lambda: True)
    return window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 1000 (--tiny: 300)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a tiny random model instead of the default model")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--profile", default=None, help="write a cProfile of the GUI thread (window runs) here")
    parser.add_argument("--job-interval-ms", type=float, default=None,
                        help="also run the window with this GIL switch interval during jobs (ui/switch_interval.py; "
                             "e.g. 5, Python's own) and print its ratio beside the shipped one's")
    args = parser.parse_args()
    new_tokens = args.max_new_tokens or (300 if args.tiny else 1000)

    from PySide6.QtCore import qInstallMessageHandler
    from PySide6.QtWidgets import QApplication

    def quiet(mode, context, message: str) -> None:  # the offscreen platform's note on every window resize
        if "propagateSizeHints" not in message:
            print(message, file=sys.stderr)

    qInstallMessageHandler(quiet)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    if args.tiny:
        from support.tiny_models import build_tiny_lm

        lm = build_tiny_lm(seed=0, max_positions=max(256, new_tokens + 64))
    else:
        from playground.models.default_model import fetch_default_model
        from playground.models.loading import load_model

        fetch_default_model()
        lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    import torch

    settings = RunSettings(prompt=args.prompt, chat=False, strategy="greedy", max_new_tokens=new_tokens)
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)  # the GUI thread's CPU time, not the wall's

    with tempfile.TemporaryDirectory() as store_dir:
        window = make_window(lm, store_dir)
        warm = settings.replace(max_new_tokens=8)
        plain_thread_run(lm, warm)
        window_run(window, warm)

        plain, ours, plain_cpu, window_cpu, lengths, paragraph = [], [], [], [], set(), 0
        alternative: list[float] = []
        for i in range(args.repeats):
            done, cpu = plain_thread_run(lm, settings)
            plain.append(done.tokens_per_s)
            plain_cpu.append(cpu / (done.decode_ms / 1000))
            lengths.add((len(done.token_ids), done.stop_reason))
            paragraph = max(len(p) for p in done.text.split("\n"))
            done, cpu = window_run(window, settings, profiler)
            ours.append(done.tokens_per_s)
            window_cpu.append(cpu / (done.decode_ms / 1000))
            lengths.add((len(done.token_ids), done.stop_reason))
            other = ""
            if args.job_interval_ms is not None:
                shipped = switch_interval.JOB_INTERVAL_S
                switch_interval.JOB_INTERVAL_S = args.job_interval_ms / 1000
                try:
                    done, _ = window_run(window, settings)
                finally:
                    switch_interval.JOB_INTERVAL_S = shipped
                alternative.append(done.tokens_per_s)
                other = f", window at {args.job_interval_ms:g} ms {alternative[-1]:.1f} tok/s " \
                        f"({alternative[-1] / plain[-1]:.2f}x)"
            print(f"  repeat {i + 1}: plain {plain[-1]:.1f} tok/s, window {ours[-1]:.1f} tok/s "
                  f"({ours[-1] / plain[-1]:.2f}x){other}", flush=True)
        window.close()
        app.processEvents()

    if len(lengths) != 1:
        print(f"warning: the runs differ in length or ending: {sorted(lengths)}")
    (n_tokens, stop_reason), *_ = sorted(lengths)
    report(f"model {lm.name} on {lm.device} ({lm.dtype_name}), {torch.get_num_threads()} torch threads, "
           f"greedy, {n_tokens} new tokens ({stop_reason}; longest paragraph {paragraph} characters), "
           f"median of {args.repeats}", "tok/s",
           ("plain thread, GUI idle", plain), ("in the window (1500x950, offscreen)", ours), goal=0.95)
    paired = statistics.median(o / r for o, r in zip(ours, plain, strict=True))
    print(f"median of the {args.repeats} side-by-side ratios: {paired:.2f}x (steadier when the machine's load drifts)")
    if alternative:
        other = statistics.median(o / r for o, r in zip(alternative, plain, strict=True))
        print(f"with a {args.job_interval_ms:g} ms switch interval during jobs instead of "
              f"{switch_interval.JOB_INTERVAL_S * 1000:g} ms: median ratio {other:.2f}x")
    print(f"GUI thread CPU per decode second: plain {statistics.median(plain_cpu) * 100:.1f}%, "
          f"window {statistics.median(window_cpu) * 100:.1f}% (median)")
    if profiler is not None:
        profiler.dump_stats(args.profile)
        print(f"GUI-thread profile written to {args.profile} (python -m pstats {args.profile})")


if __name__ == "__main__":
    main()
