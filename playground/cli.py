"""Command line: the app, headless traces and screenshots, and fetching the default model.

Qt is imported only by the subcommands that need it, so `trace` and `fetch-model` work without a display.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from playground.config import (
    DEFAULT_PROMPT,
    DEVICES,
    DTYPES,
    EARLY_STOPPING,
    STRATEGIES,
    ModelSettings,
    RunSettings,
)


def _prepare_environment() -> None:
    # Before torch is imported: OpenMP's spin-waiting threads starve a busy GUI thread (30x slower decoding),
    # and nothing may ever reach a model hub.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by the app, `trace` and `shot`; names mirror transformers' generation options."""
    d = RunSettings()
    model = parser.add_argument_group("model")
    model.add_argument("--model", default=None,
                       help="a Hugging Face folder, a .gguf file, or a model id in the local HF cache "
                            "(default: SmolLM2-135M-Instruct, fetched on first use)")
    model.add_argument("--device", choices=DEVICES, default="auto", help="auto picks cuda > mps > cpu")
    model.add_argument("--dtype", choices=DTYPES, default="auto", help="auto: float32 on CPU, bfloat16 on GPU")
    model.add_argument("--trust-remote-code", action="store_true",
                       help="allow running Python code shipped in the model folder (only for models you trust)")
    run = parser.add_argument_group("generation")
    run.add_argument("--prompt", default=DEFAULT_PROMPT)
    run.add_argument("--chat", action=argparse.BooleanOptionalAction, default=d.chat,
                     help="wrap the prompt in the tokenizer's chat template")
    run.add_argument("--system", default=d.system, help="system message (chat only)")
    run.add_argument("--strategy", choices=STRATEGIES, default=d.strategy)
    run.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    run.add_argument("--temperature", type=float, default=d.temperature)
    run.add_argument("--top-k", type=int, default=d.top_k, help="0 = off")
    run.add_argument("--top-p", type=float, default=d.top_p, help="1.0 = off")
    run.add_argument("--min-p", type=float, default=d.min_p, help="0.0 = off")
    run.add_argument("--repetition-penalty", type=float, default=d.repetition_penalty, help="1.0 = off")
    run.add_argument("--no-repeat-ngram-size", type=int, default=d.no_repeat_ngram_size, help="0 = off")
    run.add_argument("--seed", type=int, default=d.seed)
    run.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    run.add_argument("--num-candidates", type=int, default=d.num_candidates, help="top candidates kept per step")
    beam = parser.add_argument_group("beam search")
    beam.add_argument("--num-beams", type=int, default=d.num_beams)
    beam.add_argument("--length-penalty", type=float, default=d.length_penalty)
    beam.add_argument("--early-stopping", choices=EARLY_STOPPING, default=d.early_stopping)
    beam.add_argument("--num-return-sequences", type=int, default=d.num_return_sequences)


def settings_from_args(args: argparse.Namespace) -> tuple[ModelSettings, RunSettings]:
    model = ModelSettings(path=args.model, device=args.device, dtype=args.dtype,
                          trust_remote_code=args.trust_remote_code).validate()
    run = RunSettings(
        prompt=args.prompt, chat=args.chat, system=args.system, strategy=args.strategy,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        min_p=args.min_p, repetition_penalty=args.repetition_penalty,
        no_repeat_ngram_size=args.no_repeat_ngram_size, seed=args.seed, stop_strings=tuple(args.stop),
        num_candidates=args.num_candidates, num_beams=args.num_beams, length_penalty=args.length_penalty,
        early_stopping=args.early_stopping, num_return_sequences=args.num_return_sequences,
    ).validate()
    return model, run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="playground", description="Watch, steer and compare how an LM decodes.")
    commands = parser.add_subparsers(dest="command")
    app = commands.add_parser("app", help="open the desktop app (the default when no command is given)")
    add_run_options(app)
    trace = commands.add_parser("trace", help="run a generation headless and write its events as JSON lines")
    add_run_options(trace)
    trace.add_argument("--out", type=Path, default=None, help="file to write (default: stdout)")
    shot = commands.add_parser("shot", help="run a generation in the real window offscreen and save a PNG")
    add_run_options(shot)
    shot.add_argument("--out", type=Path, required=True, help="PNG file to write")
    shot.add_argument("--width", type=int, default=1500)
    shot.add_argument("--height", type=int, default=950)
    shot.add_argument("--hover", action=argparse.BooleanOptionalAction, default=True,
                      help="draw the hover tooltip of the charted token into the picture")
    fetch = commands.add_parser("fetch-model", help="download, verify and convert the default model once")
    fetch.add_argument("--force", action="store_true", help="fetch and convert again even if present")
    return parser


def _progress_to_stderr(message: str, fraction: float) -> None:
    print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)


def _ensure_default_model(model: ModelSettings) -> None:
    from playground.models.default_model import fetch_default_model, is_default_model_ready

    if model.path is None and not is_default_model_ready():
        fetch_default_model(_progress_to_stderr)


def cmd_trace(args: argparse.Namespace) -> int:
    from playground.engine.strategies import run_strategy
    from playground.events import event_to_dict
    from playground.models.loading import load_model

    model_settings, run_settings = settings_from_args(args)
    _ensure_default_model(model_settings)
    lm = load_model(model_settings, _progress_to_stderr)
    out = args.out.open("w", encoding="utf-8") if args.out else sys.stdout
    try:
        for event in run_strategy(lm, run_settings):
            out.write(json.dumps(event_to_dict(event), ensure_ascii=False) + "\n")
            out.flush()
    finally:
        if args.out:
            out.close()
    return 0


def cmd_shot(args: argparse.Namespace) -> int:
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    model_settings, run_settings = settings_from_args(args)
    _ensure_default_model(model_settings)
    from playground.ui.screenshot import render_screenshot

    path = render_screenshot(model_settings, run_settings, args.out, width=args.width, height=args.height,
                             hover=args.hover)
    print(path)
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    model_settings, run_settings = settings_from_args(args)
    from playground.ui.app import launch

    return launch(model_settings, run_settings)


def cmd_fetch(args: argparse.Namespace) -> int:
    from playground.models.default_model import fetch_default_model

    print(fetch_default_model(_progress_to_stderr, force=args.force))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    _prepare_environment()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in {"app", "trace", "shot", "fetch-model", "-h", "--help"}:
        argv.insert(0, "app")  # `playground [run options]` opens the app
    args = parser.parse_args(argv)
    handlers = {"app": cmd_app, "trace": cmd_trace, "shot": cmd_shot, "fetch-model": cmd_fetch}
    from playground.errors import USER_ERRORS

    try:
        return handlers[args.command](args)
    except USER_ERRORS as error:
        print(f"playground: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`playground trace | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
