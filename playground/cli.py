"""Command line: the app, headless traces and screenshots, saved runs, presets, and fetching the default model.

Qt is imported only by the subcommands that need it, so `trace`, `presets` and `fetch-model` work without a display.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from playground.cli_options import add_run_options, remote_source_from_args, run_options_given, settings_from_args
from playground.config import DEVICES, DTYPES

if TYPE_CHECKING:
    from playground.events import Event

COMMANDS = ("app", "trace", "shot", "open", "html", "presets", "quant-report", "fetch-model", "models",
            "install-desktop", "cache", "watermark-detect", "steer-build")


def _prepare_environment() -> None:
    # Before torch is imported: OpenMP's spin-waiting threads starve a busy GUI thread (30x slower decoding),
    # and nothing may ever reach a model hub.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _add_picture_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True,
                        help="picture to write: .png or .svg; with --from-trace also an animation of the run "
                             "replayed: .gif, .webp (lossless) or .mp4 (needs ffmpeg)")
    parser.add_argument("--view", default=None, metavar="NAME",
                        help="only this view (tokens, beam, …) instead of the whole window")
    parser.add_argument("--width", type=int, default=1500)
    parser.add_argument("--height", type=int, default=950)
    parser.add_argument("--hover", action=argparse.BooleanOptionalAction, default=True,
                        help="draw the hover tooltip of the charted token into the picture")
    parser.add_argument("--fps", type=float, default=None,
                        help="animations: a fixed pace of this many steps a second (default: the run's own pace)")
    parser.add_argument("--speed", type=float, default=1.0,
                        help="animations: play the run's own pace this many times faster (default 1)")
    parser.add_argument("--max-frames", type=int, default=None, metavar="N",
                        help="animations: the most frames an export may make (default 2000)")


def build_parser() -> argparse.ArgumentParser:
    from playground import __version__

    parser = argparse.ArgumentParser(prog="playground", description="Watch, steer and compare how an LM decodes.")
    parser.add_argument("--version", action="version", version=f"decoding-playground {__version__}")
    commands = parser.add_subparsers(dest="command")
    app = commands.add_parser("app", help="open the desktop app (the default when no command is given)")
    add_run_options(app)
    trace = commands.add_parser("trace", help="run a generation headless and write its events as JSON lines")
    add_run_options(trace)
    trace.add_argument("--out", type=Path, default=None, help="file to write (default: stdout)")
    shot = commands.add_parser("shot", help="run a generation (or show a saved run) in the real window offscreen "
                                            "and save a picture")
    add_run_options(shot)
    shot.add_argument("--from-trace", type=Path, default=None, metavar="RUN.jsonl",
                      help="show this saved run instead of generating: no model is loaded")
    _add_picture_options(shot)
    open_run = commands.add_parser("open", help="open the app on a saved run (no model is loaded)")
    open_run.add_argument("run", type=Path, metavar="RUN.jsonl")
    page = commands.add_parser("html", help="a saved run as one self-contained web page (no network needed): the "
                                            "output shaded, each token's candidates on hover or tap")
    page.add_argument("run", type=Path, metavar="RUN.jsonl")
    page.add_argument("--out", type=Path, required=True, help="the page to write (.html)")
    commands.add_parser("presets", help="list the named demos (use one with --preset NAME)")
    report = commands.add_parser("quant-report", help="quantize the model with each method and print one JSON line "
                                                      "per method: weight bytes, perplexity, KL against the reference")
    report.add_argument("--model", default=None, help="as for the app (default: SmolLM2-135M-Instruct)")
    report.add_argument("--device", choices=DEVICES, default="auto")
    report.add_argument("--dtype", choices=DTYPES, default="auto")
    report.add_argument("--methods", default="rtn-int8,rtn-int4,awq,naive-w8a8,smoothquant",
                        help="comma-separated: rtn-int8, rtn-int8-asym, rtn-int4, zeroquant, naive-w8a8, "
                             "smoothquant, awq")
    report.add_argument("--group-size", type=int, default=128, help="group size of the group-wise methods")
    report.add_argument("--eval-tokens", type=int, default=512, help="evaluation text tokens scored")
    fetch = commands.add_parser("fetch-model", help="download, verify and convert a bundled model once (the default "
                                                     "one unless named)")
    fetch.add_argument("name", nargs="?", default=None, metavar="NAME",
                       help="smollm2-135m-instruct (the default) or gemma-3-270m")
    fetch.add_argument("--force", action="store_true", help="fetch and convert again even if present")
    detect = commands.add_parser("watermark-detect", help="score a text (or a saved run's output) for a watermark; "
                                                          "--edit-budget: the score as the text is edited")
    add_run_options(detect)
    detect.add_argument("--text", default=None, help="the text to score")
    detect.add_argument("--text-file", type=Path, default=None, help="a file with the text to score")
    detect.add_argument("--from-trace", type=Path, default=None, metavar="RUN.jsonl",
                        help="score this saved run's output (its watermark settings unless --watermark is given)")
    detect.add_argument("--edit-budget", action="store_true",
                        help="one JSON line per edit: replace every k-th word, delete the middle share")
    models = commands.add_parser("models", help="list the models on this computer (Hugging Face cache, LM Studio, "
                                                "Ollama, added folders) with their size and memory, nothing loaded")
    models.add_argument("--dtype", choices=DTYPES, default="auto", help="the memory column's dtype (auto: float32)")
    models.add_argument("--device", choices=DEVICES, default="auto", help="whose free memory they are checked against")
    models.add_argument("--add", type=Path, default=None, metavar="DIR", help="add a folder to search for models")
    models.add_argument("--remove", type=Path, default=None, metavar="DIR", help="stop searching an added folder")
    models.add_argument("--json", action="store_true", help="one JSON object per model instead of the table")
    desktop = commands.add_parser("install-desktop", help="add the app to the desktop's menus (a .desktop entry and "
                                                          "its icon under ~/.local/share)")
    desktop.add_argument("--uninstall", action="store_true", help="remove the entry and the icon")
    cache = commands.add_parser("cache", help="the GGUF conversion cache: each .gguf converted once, with its size")
    cache.add_argument("--clear", action="store_true", help="remove every cached conversion")
    _add_steer_build(commands)
    return parser


def _add_steer_build(commands) -> None:
    build = commands.add_parser(
        "steer-build", help="build a steering vector from a contrast set and save it (.gguf: a llama.cpp control "
                            "vector, as llama-server --control-vector-scaled reads; .safetensors: ours)")
    build.add_argument("--set", dest="contrast", required=True, metavar="NAME|FILE.json",
                       help="a shipped contrast set (happy-sad, formal-casual, english-french) or a JSON file of the "
                            "same form (resources/steering/*.json)")
    build.add_argument("--method", choices=("mean", "pca", "actadd", "mean-diff"), default=None,
                       help="mean: the mean difference at the last token (CAA); pca: the first principal component "
                            "of the pairs' differences (repeng); actadd: the first pair at every position, added at "
                            "the front (.safetensors only); default: the set's own")
    build.add_argument("--layers", default="", metavar="A-B",
                       help="the decoder blocks N, from 0, both ends included (as --steer-layers); default: every "
                            "block but the first")
    build.add_argument("--out", type=Path, required=True, metavar="FILE.gguf|FILE.safetensors",
                       help="the file to write; its suffix picks the format")
    build.add_argument("--model", default=None, help="as for the app (default: SmolLM2-135M-Instruct)")
    build.add_argument("--device", choices=DEVICES, default="auto")
    build.add_argument("--dtype", choices=DTYPES, default="auto")


def _progress_to_stderr(message: str, fraction: float) -> None:
    print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)


def _ensure_default_model(model) -> None:
    """The default model, or a bundled one named by ``--model`` (gemma-3-270m), fetched on first use."""
    from playground.models.bundled import find_bundled

    bundled = find_bundled(model.path) if model.path is None or not Path(model.path).expanduser().exists() else None
    if bundled is not None and not bundled.is_ready():
        bundled.fetch(_progress_to_stderr)


def cmd_trace(args: argparse.Namespace) -> int:
    from playground.events import dumps_event

    source = remote_source_from_args(args)
    model_settings, run_settings = settings_from_args(args)
    if source is not None:  # a server: no model is loaded here (and torch is never imported)
        from playground.remote.decode import run_remote

        events: Iterator[Event] = run_remote(source, run_settings)
    else:
        from playground.engine.strategies import run_strategy
        from playground.models.loading import load_model

        _ensure_default_model(model_settings)
        lm = load_model(model_settings, _progress_to_stderr)
        events = run_strategy(lm, run_settings, progress=_progress_to_stderr)  # --quant reports its build
    out = args.out.open("w", encoding="utf-8") if args.out else sys.stdout
    try:
        for event in events:
            out.write(dumps_event(event) + "\n")
            out.flush()
    finally:
        if args.out:
            out.close()
    return 0


def _headless_qt() -> None:
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def cmd_shot(args: argparse.Namespace) -> int:
    source = remote_source_from_args(args)
    _headless_qt()
    if args.from_trace is not None:
        if source is not None:
            from playground.config import ConfigError

            raise ConfigError("--from-trace shows a saved run: it needs no server (leave out --base-url)")
        if run_options_given(args):
            print("playground: note: run options are ignored with --from-trace (the saved run has its own)",
                  file=sys.stderr)
        from playground.ui.animation import FORMATS
        from playground.ui.screenshot import render_animation, render_trace

        if args.out.suffix.lower() in FORMATS:
            result, problems = render_animation(args.from_trace, args.out, width=args.width, height=args.height,
                                                view=args.view, fps=args.fps, speed=args.speed, hover=args.hover,
                                                max_frames=args.max_frames)
            if problems:
                print(f"playground: warning: {args.from_trace}: {problems}", file=sys.stderr)
            print(f"playground: wrote {result.frames} frames, {result.bytes / 1e6:.2f} MB, in {result.seconds:.1f} s",
                  file=sys.stderr)
            print(result.path)
            return 0
        path, problems = render_trace(args.from_trace, args.out, width=args.width, height=args.height,
                                      hover=args.hover, view=args.view)
        if problems:
            print(f"playground: warning: {args.from_trace}: {problems}", file=sys.stderr)
        print(path)
        return 0
    from playground.ui.animation import FORMATS

    if args.out.suffix.lower() in FORMATS:
        from playground.config import ConfigError

        raise ConfigError(f"an animation replays a saved run: write the run first (playground trace --out run.jsonl "
                          f"…), then playground shot --from-trace run.jsonl --out {args.out.name}")
    model_settings, run_settings = settings_from_args(args)
    if source is None:  # a server needs no local model
        _ensure_default_model(model_settings)
    from playground.ui.screenshot import render_screenshot

    view = args.view
    if view is None and args.preset:  # a preset names the view it is meant to be watched in
        from playground.presets import load_preset

        view = load_preset(args.preset).view
    path = render_screenshot(model_settings, run_settings, args.out, width=args.width, height=args.height,
                             hover=args.hover, view=view, remote=source)
    print(path)
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    source = remote_source_from_args(args)  # --base-url: the window uses that server instead of loading a model
    model_settings, run_settings = settings_from_args(args)
    from playground.ui.app import launch

    # No run option on the command line: the window starts from the user's last settings.
    return launch(model_settings, run_settings if run_options_given(args) else None, remote=source)


def cmd_open(args: argparse.Namespace) -> int:
    from playground.traces import read_trace
    from playground.ui.app import launch

    read_trace(args.run)  # refuse a file that holds no run before any window opens
    return launch(None, None, open_run=args.run)


def cmd_html(args: argparse.Namespace) -> int:
    from playground.traces import read_trace
    from playground.ui.web_page import write_page

    trace = read_trace(args.run)
    if trace.problems():
        print(f"playground: warning: {args.run}: {trace.problems()}", file=sys.stderr)
    path = write_page(trace.events, args.out)
    steps = sum(1 for e in trace.events if getattr(e, "type", "") == "token")
    print(f"playground: wrote {path.stat().st_size / 1024:.0f} KB for {steps} steps", file=sys.stderr)
    print(path)
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from playground.presets import all_presets
    from playground.state import settings_summary

    for preset in all_presets():
        print(f"{preset.name}\n    {preset.title} ({settings_summary(preset.settings)}; view: {preset.view})\n"
              f"    {preset.description}")
    return 0


def cmd_quant_report(args: argparse.Namespace) -> int:
    import json

    from playground.config import ModelSettings
    from playground.engine.quant.report import check_methods, report_rows
    from playground.models.loading import load_model

    methods = [m for m in args.methods.replace(" ", "").split(",") if m]
    check_methods(methods)
    model_settings = ModelSettings(path=args.model, device=args.device, dtype=args.dtype).validate()
    _ensure_default_model(model_settings)
    lm = load_model(model_settings, _progress_to_stderr)
    for row in report_rows(lm.model, lm.tokenizer, methods, args.group_size, args.eval_tokens):
        print(json.dumps(row), flush=True)
    return 0


def cmd_watermark_detect(args: argparse.Namespace) -> int:
    from playground.cli_watermark import watermark_detect

    return watermark_detect(args, _ensure_default_model, _progress_to_stderr)


def cmd_fetch(args: argparse.Namespace) -> int:
    from playground.models.bundled import bundled_keys, find_bundled

    bundled = find_bundled(args.name)
    if bundled is None:
        from playground.config import ConfigError

        raise ConfigError(f"no bundled model named {args.name!r} (known: {', '.join(bundled_keys())})")
    if bundled.terms and bundled.is_ready() and not args.force:  # a fetch says them in its progress
        print(f"playground: {bundled.terms}", file=sys.stderr)
    print(bundled.fetch(_progress_to_stderr, force=args.force))
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    import time

    from playground.models.conversion_cache import cache_dir, cache_entries, cache_size, clear_cache, describe_size

    if args.clear:
        print(f"removed {describe_size(clear_cache())} from {cache_dir()}")
        return 0
    entries = cache_entries()
    print(f"{cache_dir()}: {len(entries)} converted GGUF file{'s' * (len(entries) != 1)}, "
          f"{describe_size(cache_size())} (`playground cache --clear` empties it)")
    for entry in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.converted_at))
        print(f"  {describe_size(entry.size_bytes):>9}  {when}  {entry.source}  (sha256 {entry.sha256[:12]}…, "
              f"converted in {entry.seconds:.0f} s)")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from playground.models.listing import models_report

    print(models_report(add=args.add, remove=args.remove, dtype=args.dtype, device=args.device, as_json=args.json))
    return 0


def cmd_install_desktop(args: argparse.Namespace) -> int:
    from playground.desktop import install_desktop, uninstall_desktop

    for path in (uninstall_desktop() if args.uninstall else install_desktop()):
        print(path)
    return 0


def cmd_steer_build(args: argparse.Namespace) -> int:
    """Build a steering vector and save it; progress on stderr, the file written on stdout. Ctrl-C (SIGINT) asks
    the build to stop after the example being read: nothing is written, exit status 130 (a second Ctrl-C
    interrupts at once)."""
    import signal

    from playground.config import ModelSettings
    from playground.engine.steering.contrast_sets import BuildPlan

    plan = BuildPlan.of(args.contrast, args.method, args.layers, args.out)
    model_settings = ModelSettings(path=args.model, device=args.device, dtype=args.dtype).validate()
    _ensure_default_model(model_settings)
    from playground.engine.run_context import RunContext
    from playground.engine.steering.build import build_vector
    from playground.engine.steering.files import save_vector
    from playground.models.anatomy import anatomy_of
    from playground.models.loading import load_model

    lm = load_model(model_settings, _progress_to_stderr)
    layers = plan.layers(anatomy_of(lm.model).count)
    asked = {"stop": False}

    def on_interrupt(signum, frame) -> None:
        asked["stop"] = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C interrupts at once
        print("playground: stopping after this example (Ctrl-C again to interrupt now)…", file=sys.stderr,
              flush=True)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        vector = build_vector(lm, plan.contrast, method=plan.method, layers=layers,
                              context=RunContext(should_stop=lambda: asked["stop"], progress=_progress_to_stderr))
    finally:
        signal.signal(signal.SIGINT, previous)
    if vector is None:
        print("playground: stopped: no vector was written", file=sys.stderr)
        return 130
    path = save_vector(vector, plan.out)
    norms = ", ".join(f"{n}: {vector.norm(n):.2f}" for n in vector.layers[:3])
    more = " …" if len(vector.layers) > 3 else ""
    print(f"playground: {plan.method} vector of {plan.contrast.name} on {lm.name}, blocks {vector.layers[0]}–"
          f"{vector.layers[-1]} (norms {norms}{more}); use it with --steer {path}:STRENGTH", file=sys.stderr)
    print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    _prepare_environment()
    from playground.config.plugins import CapabilityError, load_capabilities

    try:
        load_capabilities()  # before the parser: a capability's strategy and flags are the parser's too
    except CapabilityError as error:
        print(f"playground: error: {error}", file=sys.stderr)
        return 2
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in {*COMMANDS, "-h", "--help", "--version"}:
        argv.insert(0, "app")  # `playground [run options]` opens the app
    args = parser.parse_args(argv)
    handlers = {"app": cmd_app, "trace": cmd_trace, "shot": cmd_shot, "open": cmd_open, "html": cmd_html,
                "presets": cmd_presets, "quant-report": cmd_quant_report, "fetch-model": cmd_fetch,
                "models": cmd_models, "install-desktop": cmd_install_desktop, "cache": cmd_cache,
                "watermark-detect": cmd_watermark_detect, "steer-build": cmd_steer_build}
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`playground trace | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as error:
        # Imported only now: the error types' modules pull in torch, which a remote trace never needs.
        from playground.errors import USER_ERRORS

        if not isinstance(error, USER_ERRORS):
            raise
        print(f"playground: error: {error}", file=sys.stderr)
        return 2
