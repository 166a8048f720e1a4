"""Run options for the command line, built from the settings tables (``playground.config``).

Every registered settings group adds its own argument group; nothing here names a capability's settings.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from playground.config import DEVICES, DTYPES, GROUPS, ModelSettings, Row, RunSettings, SettingsGroup, rows

_UNSET = None  # options left at None were not given: the preset (or the default) decides


def _add(parser: argparse._ArgumentGroup, row: Row) -> None:
    spec = row.spec
    help_text = f"{spec.help} (default: {row.default!r})" if row.default not in ((), "") else spec.help
    if row.type is bool:
        parser.add_argument(row.flag, dest=row.name, action=argparse.BooleanOptionalAction, default=_UNSET,
                            help=help_text)
    elif row.type in (int, float, str):
        parser.add_argument(row.flag, dest=row.name, type=row.type, default=_UNSET, help=help_text,
                            choices=spec.choices or None)
    else:  # a tuple of strings: repeat the flag
        parser.add_argument(row.flag, dest=row.name, action="append", default=_UNSET, metavar="TEXT",
                            help=f"{spec.help} (repeatable)")


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by the app, `trace` and `shot`; names mirror transformers' generation options."""
    from playground.engine.strategies import STRATEGIES

    model = parser.add_argument_group("model")
    model.add_argument("--model", default=None,
                       help="a Hugging Face folder, a .gguf file, or a model id in the local HF cache "
                            "(default: SmolLM2-135M-Instruct, fetched on first use)")
    model.add_argument("--device", choices=DEVICES, default="auto", help="auto picks cuda > mps > cpu")
    model.add_argument("--dtype", choices=DTYPES, default="auto", help="auto: float32 on CPU, bfloat16 on GPU")
    model.add_argument("--trust-remote-code", action="store_true",
                       help="allow running Python code shipped in the model folder (only for models you trust)")
    run = parser.add_argument_group("generation")
    run.add_argument("--preset", default=None, metavar="NAME",
                     help="start from a named demo (`playground presets` lists them); other options override it")
    run.add_argument("--strategy", choices=tuple(STRATEGIES), default=_UNSET,
                     help="; ".join(f"{s.name}: {s.help}" for s in STRATEGIES.values()))
    for row in rows(RunSettings):
        if row.spec.cli:
            _add(run, row)
    for group in GROUPS.values():
        section = parser.add_argument_group(group.title.lower())
        for row in rows(group):
            if row.spec.cli:
                _add(section, row)


def _given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    names = [row.name for row in rows(cls) if row.spec.cli] + (["strategy"] if cls is RunSettings else [])
    values = {}
    for name in names:
        value = getattr(args, name, _UNSET)
        if value is not _UNSET:
            values[name] = tuple(value) if isinstance(value, list) else value
    return values


def settings_from_args(args: argparse.Namespace) -> tuple[ModelSettings, RunSettings]:
    """The model and run settings the options ask for: the preset's (if any), then each option given."""
    from playground.presets import load_preset

    model = ModelSettings(path=args.model, device=args.device, dtype=args.dtype,
                          trust_remote_code=args.trust_remote_code).validate()
    base = load_preset(args.preset).settings if args.preset else RunSettings()
    run = base.replace(**_given(args, RunSettings))
    groups: list[SettingsGroup] = [dataclasses.replace(base.group(cls), **_given(args, cls))
                                   for cls in GROUPS.values()]
    run = run.replace(groups=tuple(groups))
    return model, run.validate()


def run_options_given(args: argparse.Namespace) -> bool:
    """Whether any run option (or a preset) was given on the command line."""
    if getattr(args, "preset", None):
        return True
    return any(_given(args, cls) for cls in (RunSettings, *GROUPS.values()))
