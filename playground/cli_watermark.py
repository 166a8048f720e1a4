"""``playground watermark-detect``: score a text, a file or a saved run's output for a watermark (one JSON line:
scored tokens, green count, z-score, p-value, verdict), or with ``--edit-budget`` one line per edit (replace every
k-th word, delete the middle share of the words) to see where detection fails."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from playground.config.errors import ConfigError


def _text_and_settings(args: argparse.Namespace, settings: Any) -> tuple[str, Any]:
    from playground.config.samplers.watermark import WatermarkSettings

    given = [name for name in ("text", "text_file", "from_trace") if getattr(args, name) is not None]
    if len(given) != 1:
        raise ConfigError("watermark-detect: give exactly one of --text, --text-file or --from-trace")
    g = settings.group(WatermarkSettings)
    if args.text is not None:
        return args.text, g
    if args.text_file is not None:
        try:
            return args.text_file.read_text(encoding="utf-8"), g
        except OSError as error:
            raise ConfigError(f"watermark-detect: cannot read {args.text_file}: {error.strerror}") from None
    from playground.events import RunFinished, RunStarted
    from playground.traces import read_trace

    trace = read_trace(args.from_trace)
    done = next((e for e in trace.events if isinstance(e, RunFinished)), None)
    start = next((e for e in trace.events if isinstance(e, RunStarted)), None)
    if done is None:
        raise ConfigError(f"watermark-detect: {args.from_trace} has no finished run to score")
    if not g.active() and start is not None:  # the run's own watermark
        from playground.config import RunSettings

        saved, _ = RunSettings.from_plain_dict(start.settings)
        g = dataclasses.replace(saved.group(WatermarkSettings), z_threshold=g.z_threshold,  # the detector's own
                                ignore_repeated_ngrams=g.ignore_repeated_ngrams, entropy_threshold=g.entropy_threshold)
    return done.text, g


def watermark_detect(args: argparse.Namespace, ensure_model: Callable[[Any], None],
                     progress: Callable[[str, float], None]) -> int:
    from playground.cli_options import settings_from_args
    from playground.engine.watermark.score import detect_text, edit_budget
    from playground.models.loading import load_model

    model_settings, settings = settings_from_args(args)
    text, g = _text_and_settings(args, settings)
    ensure_model(model_settings)
    lm = load_model(model_settings, progress)
    if args.edit_budget:
        for row in edit_budget(lm, g, text, seed=settings.seed):
            print(json.dumps(row.as_dict()), flush=True)
        return 0
    d = detect_text(lm, g, text)
    print(json.dumps({"scheme": g.watermark, "scored": d.scored, "green": d.green,
                      "green_fraction": round(d.green_fraction, 4), "z_score": round(d.z_score, 4),
                      "p_value": d.p_value, "threshold": d.threshold, "verdict": d.verdict}))
    return 0
