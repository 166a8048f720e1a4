"""The GUI thread's share while streaming, with every view docked side by side and on screen.

The real ``MainWindow`` (offscreen, wide enough that every dock is shown at once: ``views_side_by_side``) runs real
generations on the default model: presets whose runs feed the tokens, speculative and contrastive views (and the
layers view where a preset records the lens). For each run, the GUI thread's CPU time (``time.thread_time`` in the
GUI thread, around the event loop that waits for the run) is divided by the run's wall time; the worker's decode
rate is the run's own ``RunFinished.tokens_per_s``. The load average is printed beside them: the machine is shared,
so compare figures of one invocation, or of invocations made under a similar load.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/bench_gui_share.py [--repeats 3] [--max-new-tokens 160]
    ... --presets greedy-loop,speculative-prompt-lookup      (the default: the four below)
    ... --tiny      a tiny random model (a quick smoke run; presets still give the settings)
    ... --profile FILE   cProfile of the GUI thread during the measured runs (pstats file)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from playground.config import ModelSettings

PRESETS = ("greedy-loop", "logit-lens", "speculative-prompt-lookup", "contrastive-early-layer")
POLL_MS = 50
SIZE = (3800, 1000)  # every dock side by side needs the width (their minimum widths add up)


def spin_until(done) -> None:
    """A Qt event loop until ``done()`` (checked every POLL_MS): the GIL is free while it waits."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    timer = QTimer()
    timer.setInterval(POLL_MS)
    timer.timeout.connect(lambda: done() and loop.quit())
    timer.start()
    if not done():
        loop.exec()
    timer.stop()


def make_window(lm, store_dir: str):
    from PySide6.QtCore import QSettings

    from playground.ui.main_window import MainWindow

    store = QSettings(str(Path(store_dir) / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(store=store)
    window.resize(*SIZE)
    window.show()
    window.set_model(lm)
    window.views_side_by_side()
    spin_until(lambda: True)
    return window


def streamed(window, settings, profiler=None) -> tuple[float, float, float, int]:
    """One run in the window: (GUI CPU s, wall s, decode tok/s, tokens)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    if profiler is not None:
        profiler.enable()
    run = window.start_run(settings)
    spin_until(lambda: not window.busy)
    if profiler is not None:
        profiler.disable()
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    assert run.finished is not None, f"the window's run did not finish: {run.error}"
    return cpu, wall, run.finished.tokens_per_s, len(run.unit_steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--profile", default=None)
    args = parser.parse_args()
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()

    from PySide6.QtCore import qInstallMessageHandler
    from PySide6.QtWidgets import QApplication

    def quiet(mode, context, message: str) -> None:
        if "propagateSizeHints" not in message:
            print(message, file=sys.stderr)

    qInstallMessageHandler(quiet)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    if args.tiny:
        from playground.tiny_models import build_tiny_lm

        lm = build_tiny_lm(seed=0, max_positions=args.max_new_tokens + 512)
    else:
        from playground.models.default_model import fetch_default_model
        from playground.models.loading import load_model

        fetch_default_model()
        lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    from playground.presets import load_preset

    names = [n for n in args.presets.split(",") if n]
    settings = {n: load_preset(n).settings.replace(max_new_tokens=args.max_new_tokens) for n in names}
    load = os.getloadavg()
    rows: dict[str, list[tuple[float, float, float, int]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as store_dir:
        window = make_window(lm, store_dir)
        shown = [name for name, dock in window.docks.items() if dock.isVisible()]
        print(f"docks on screen: {len(shown)} of {len(window.docks)} ({', '.join(shown)})", flush=True)
        for n in names:  # warm-up: every strategy once, short
            streamed(window, settings[n].replace(max_new_tokens=8))
        for i in range(args.repeats):
            for n in names:
                rows[n].append(streamed(window, settings[n], profiler))
                cpu, wall, rate, count = rows[n][-1]
                print(f"  repeat {i + 1} {n}: GUI {cpu / wall * 100:.1f}% of {wall:.1f} s wall "
                      f"({cpu / count * 1000:.1f} ms per step), {rate:.1f} tok/s, {count} steps", flush=True)
        window.close()
        app.processEvents()
    end_load = os.getloadavg()
    print(f"model {lm.name}, window {SIZE[0]}x{SIZE[1]} offscreen, every view side by side, "
          f"max {args.max_new_tokens} new tokens, median of {args.repeats}")
    print(f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"at end {end_load[0]:.2f} {end_load[1]:.2f} {end_load[2]:.2f}")
    shares = []
    for n in names:
        share = statistics.median(cpu / wall for cpu, wall, _, _ in rows[n])
        per_step = statistics.median(cpu / count for cpu, _, _, count in rows[n])
        rate = statistics.median(r for _, _, r, _ in rows[n])
        shares.append(share)
        print(f"{n:32s} GUI thread {share * 100:5.1f}% of the wall time ({per_step * 1000:5.1f} ms per step)   "
              f"worker {rate:6.1f} tok/s")
    all_cpu = sum(cpu for n in names for cpu, _, _, _ in rows[n])
    all_wall = sum(wall for n in names for _, wall, _, _ in rows[n])
    print(f"{'all runs':32s} GUI thread {all_cpu / all_wall * 100:5.1f}% of the wall time")
    if profiler is not None:
        profiler.dump_stats(args.profile)
        print(f"GUI-thread profile written to {args.profile} (python -m pstats {args.profile})")


if __name__ == "__main__":
    main()
