"""What issue #35 asks of an animation, measured in one run: a 200-step sampled run of the default model replayed
as the tokens view at 1280×800, exported as GIF (goal: under 30 s and under 5 MB), and as lossless WebP and (where
an ffmpeg program is found) MP4 beside it. Prints each file's size, the export's wall time and this process's CPU
time for it. The trace is made first (not timed) and kept, so a second run can reuse it with --trace.

    .venv/bin/python benchmarks/bench_animation.py [--trace RUN.jsonl] [--out-dir DIR] [--formats gif,webp,mp4]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

PROMPT = "Tell me a story about a lighthouse keeper."
GOAL_S, GOAL_MB = 30.0, 5.0


def make_trace(path: Path) -> None:
    from playground.config import ModelSettings, RunSettings
    from playground.engine.strategies import run_strategy
    from playground.models.default_model import fetch_default_model
    from playground.models.loading import load_model
    from playground.traces import write_trace

    lm = load_model(ModelSettings(path=str(fetch_default_model()), device="cpu"))
    settings = RunSettings(prompt=PROMPT, strategy="sample", temperature=0.9, seed=1, max_new_tokens=200)
    write_trace(list(run_strategy(lm, settings)), path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, help="a saved run to animate instead of making one")
    parser.add_argument("--out-dir", type=Path, default=Path("/tmp/animation"))
    parser.add_argument("--formats", default="gif,webp,mp4")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    trace = args.trace or args.out_dir / "run200.jsonl"
    if args.trace is None and not trace.exists():
        make_trace(trace)

    from playground.ui.animation import ffmpeg_program
    from playground.ui.screenshot import render_animation

    for suffix in args.formats.split(","):
        if suffix == "mp4" and ffmpeg_program() is None:
            print("mp4: no ffmpeg program here (skipped)")
            continue
        out = args.out_dir / f"tokens.{suffix}"
        wall, cpu = time.perf_counter(), time.process_time()
        result, _problems = render_animation(trace, out, 1280, 800, view="tokens", quiet=True)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        mb = result.bytes / 1e6
        goal = (f" (goal: under {GOAL_S:.0f} s and {GOAL_MB:.0f} MB: "
                f"{'met' if wall < GOAL_S and mb < GOAL_MB else 'NOT met'})") if suffix == "gif" else ""
        print(f"{suffix}: {result.frames} frames, {mb:.2f} MB, {wall:.1f} s wall, {cpu:.1f} s CPU{goal}")


if __name__ == "__main__":
    main()
