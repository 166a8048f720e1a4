"""The GUI thread's share while streaming, with every view docked side by side and on screen.

The real ``MainWindow`` (offscreen, wide enough that every dock is shown at once: ``views_side_by_side``) runs real
generations on the default model: presets whose runs feed the tokens, speculative and contrastive views (and the
layers view where a preset records the lens). For each run, the GUI thread's CPU time (``time.thread_time`` in the
GUI thread, around the event loop that waits for the run) is divided by the run's wall time; the worker's decode
rate is the run's own ``RunFinished.tokens_per_s``. The steadier figure is the GUI thread's CPU time per generated
token (the share also moves with the worker's speed). The load average is printed beside them: the machine is
shared, so compare figures of one invocation, or of invocations made under a similar load.

A/B: ``--ab OTHER --rounds N`` alternates two checkouts of the project, N rounds (OTHER, this one, OTHER, this
one, ...): each round is this script in a fresh process measuring that checkout's ``playground`` package
(``--checkout DIR``), and the medians over the rounds are compared, with the load average during each.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/bench_gui_share.py [--repeats 3] [--max-new-tokens 160]
    ... --presets greedy-loop,speculative-prompt-lookup      (the default: the four below)
    ... --tiny      a tiny random model (a quick smoke run; presets still give the settings)
    ... --profile FILE   cProfile of the GUI thread's CPU time during the measured runs (pstats file)
    ... --tabs           the default layout instead (the views tabbed: one on screen at a time)
    ... --ab /tmp/before --rounds 3 [--repeats 1]   A/B against another checkout, interleaved
    ... --checkout DIR   measure DIR's playground package (default: this script's checkout)
    ... --json FILE      the figures as JSON (what --ab reads)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _checkout_first() -> Path:
    """The checkout whose ``playground`` is measured (``--checkout DIR``, else this script's), first on
    ``sys.path``: a script's own folder is what Python puts there, and an installed package would win."""
    root = Path(__file__).resolve().parent.parent
    if "--checkout" in sys.argv:
        root = Path(sys.argv[sys.argv.index("--checkout") + 1]).resolve()
    sys.path.insert(0, str(root))
    sys.path.insert(1, str(root / "tests"))  # tests/support: the tiny model
    return root


CHECKOUT = _checkout_first()

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

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


def make_window(lm, store_dir: str, tabs: bool = False):
    from PySide6.QtCore import QSettings

    from playground.ui.main_window import MainWindow

    store = QSettings(str(Path(store_dir) / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(store=store)
    window.resize(*SIZE)
    window.show()
    window.set_model(lm)
    if not tabs:
        window.views_side_by_side()
    spin_until(lambda: True)
    return window


def streamed(window, settings, profiler=None) -> tuple[float, float, float, int]:
    """One run in the window: (GUI CPU s, wall s, decode tok/s, generated tokens)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    if profiler is not None:
        profiler.enable()
    run = window.start_run(settings)
    spin_until(lambda: not window.busy)
    if profiler is not None:
        profiler.disable()
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    assert run.finished is not None, f"the window's run did not finish: {run.error}"
    return cpu, wall, run.finished.tokens_per_s, len(run.finished.token_ids) or len(run.unit_steps)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--profile", default=None)
    parser.add_argument("--tabs", action="store_true",
                        help="the default layout (the views tabbed, the run's own view in front) instead of every "
                             "view side by side")
    parser.add_argument("--checkout", default=None, help="measure this checkout's playground package")
    parser.add_argument("--json", default=None, help="write the figures here as JSON")
    parser.add_argument("--ab", default=None, metavar="OTHER", help="alternate with the checkout OTHER (A/B)")
    parser.add_argument("--rounds", type=int, default=3, help="with --ab: rounds per checkout")
    return parser.parse_args()


def measure(args: argparse.Namespace) -> dict:
    """Every preset ``args.repeats`` times in one window: the figures printed, and returned for ``--json``."""
    import playground

    print(f"measuring {Path(playground.__file__).resolve().parent}", flush=True)
    from playground.config import ModelSettings

    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)  # the GUI thread's CPU time, not the wall's

    from PySide6.QtCore import qInstallMessageHandler
    from PySide6.QtWidgets import QApplication

    def quiet(mode, context, message: str) -> None:
        if "propagateSizeHints" not in message:
            print(message, file=sys.stderr)

    qInstallMessageHandler(quiet)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    if args.tiny:
        from support.tiny_models import build_tiny_lm

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
        window = make_window(lm, store_dir, args.tabs)
        shown = [name for name, dock in window.docks.items() if dock.isVisible()]
        if args.tabs:  # a dock tabbed behind another is moved out of the window, not hidden: isVisible stays True
            print(f"docks: {len(window.docks)}, tabbed (the run's own view in front)", flush=True)
        else:
            print(f"docks on screen: {len(shown)} of {len(window.docks)} ({', '.join(shown)})", flush=True)
        for n in names:  # warm-up: every strategy once, short
            streamed(window, settings[n].replace(max_new_tokens=8))
        for i in range(args.repeats):
            for n in names:
                rows[n].append(streamed(window, settings[n], profiler))
                cpu, wall, rate, count = rows[n][-1]
                print(f"  repeat {i + 1} {n}: GUI {cpu / wall * 100:.1f}% of {wall:.1f} s wall "
                      f"({cpu / count * 1000:.1f} ms per token), {rate:.1f} tok/s, {count} tokens", flush=True)
        window.close()
        app.processEvents()
    end_load = os.getloadavg()
    layout = "the views tabbed (the default layout)" if args.tabs else "every view side by side"
    print(f"model {lm.name}, window {SIZE[0]}x{SIZE[1]} offscreen, {layout}, "
          f"max {args.max_new_tokens} new tokens, median of {args.repeats}")
    print(f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"at end {end_load[0]:.2f} {end_load[1]:.2f} {end_load[2]:.2f}")
    for n in names:
        share = statistics.median(cpu / wall for cpu, wall, _, _ in rows[n])
        per_token = statistics.median(cpu / count for cpu, _, _, count in rows[n])
        rate = statistics.median(r for _, _, r, _ in rows[n])
        print(f"{n:32s} GUI thread {share * 100:5.1f}% of the wall time ({per_token * 1000:5.1f} ms per token)   "
              f"worker {rate:6.1f} tok/s")
    all_cpu = sum(cpu for n in names for cpu, _, _, _ in rows[n])
    all_wall = sum(wall for n in names for _, wall, _, _ in rows[n])
    all_tokens = sum(count for n in names for _, _, _, count in rows[n])
    print(f"{'all runs':32s} GUI thread {all_cpu / all_wall * 100:5.1f}% of the wall time "
          f"({all_cpu / all_tokens * 1000:5.1f} ms per token)")
    if profiler is not None:
        profiler.dump_stats(args.profile)
        print(f"GUI-thread profile written to {args.profile} (python -m pstats {args.profile})")
    return {"checkout": str(CHECKOUT), "load_start": load[0], "load_end": end_load[0],
            "cpu_s": all_cpu, "wall_s": all_wall, "tokens": all_tokens,
            "presets": {n: [list(r) for r in rows[n]] for n in names}}


def alternate(args: argparse.Namespace) -> None:
    """``--ab OTHER``: OTHER and this checkout measured in turn, ``args.rounds`` times each, one process each."""
    checkouts = {"A (other)": Path(args.ab).resolve(), "B (this)": CHECKOUT}
    passed = ["--presets", args.presets, "--repeats", str(args.repeats), "--max-new-tokens", str(args.max_new_tokens)]
    if args.tiny:
        passed.append("--tiny")
    if args.tabs:
        passed.append("--tabs")
    results: dict[str, list[dict]] = {label: [] for label in checkouts}
    with tempfile.TemporaryDirectory() as out:
        for i in range(args.rounds):
            for label, root in checkouts.items():
                path = Path(out) / f"{i}-{label[0]}.json"
                command = [sys.executable, str(Path(__file__).resolve()), *passed, "--checkout", str(root),
                           "--json", str(path)]
                print(f"=== round {i + 1} {label}: {root}", flush=True)
                subprocess.run(command, cwd=root, check=True)
                results[label].append(json.loads(path.read_text()))
    print(f"\nA/B, {args.rounds} rounds each, interleaved; presets {args.presets}, {args.repeats} repeat(s) per round")
    for label, rounds in results.items():
        for i, r in enumerate(rounds):
            print(f"  {label} round {i + 1}: GUI {r['cpu_s'] / r['tokens'] * 1000:6.2f} ms per token, "
                  f"{r['cpu_s'] / r['wall_s'] * 100:5.1f}% of the wall time, {r['tokens']} tokens, "
                  f"load {r['load_start']:.2f} -> {r['load_end']:.2f}")
    medians = {}
    for label, rounds in results.items():
        per_token = statistics.median(r["cpu_s"] / r["tokens"] for r in rounds)
        share = statistics.median(r["cpu_s"] / r["wall_s"] for r in rounds)
        medians[label] = per_token
        print(f"{label:10s} median GUI {per_token * 1000:6.2f} ms per token, {share * 100:5.1f}% of the wall time")
    a, b = medians.values()
    print(f"B / A GUI CPU per token: {b / a:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def main() -> None:
    args = parse_args()
    if args.ab:
        alternate(args)
        return
    figures = measure(args)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
