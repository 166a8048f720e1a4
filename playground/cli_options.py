"""Run options for the command line, built from the settings tables (``playground.config``).

Every registered settings group adds its own argument group; nothing here names a capability's settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import typing
from typing import Any

from playground.config import DEVICES, DTYPES, GROUPS, ConfigError, ModelSettings, Row, RunSettings, SettingsGroup, rows

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
    _add_remote_options(model)
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


def _add_remote_options(parser: argparse._ArgumentGroup) -> None:
    """A server instead of a local model (``playground.remote``): --base-url, --remote-model, --api-key-env, ..."""
    from playground.remote.source import RemoteSource

    for row in rows(RemoteSource):
        dest = f"remote_{row.name}"
        if row.type is bool:
            parser.add_argument(row.flag, dest=dest, action="store_true", help=row.spec.help)
        else:
            metavar = {"base_url": "URL", "model": "NAME", "api_key_env": "VAR", "timeout_s": "SECONDS"}[row.name]
            parser.add_argument(row.flag, dest=dest, type=row.type, default=None, metavar=metavar,
                                help=f"{row.spec.help} (default: {row.default!r})" if row.default else row.spec.help)


def remote_source_from_args(args: argparse.Namespace):  # -> RemoteSource | None (imported lazily)
    """The server the options name (``--base-url``), or None for a local model; refuses mixing the two."""
    from playground.remote.source import RemoteSource

    given = {row.name: getattr(args, f"remote_{row.name}", None) for row in rows(RemoteSource)}
    given = {name: value for name, value in given.items() if value not in (None, False)}
    if "base_url" not in given:
        if given:
            flags = ", ".join(row.flag for row in rows(RemoteSource) if row.name in given)
            raise ConfigError(f"{flags} {'needs' if len(given) == 1 else 'need'} --base-url (the server to use)")
        return None
    if args.model is not None:
        raise ConfigError("--base-url and --model are mutually exclusive: a run uses either a local model (--model) "
                          "or a server (--base-url, with --remote-model to pick the server's model)")
    local = [flag for flag, on in (("--device", args.device != "auto"), ("--dtype", args.dtype != "auto"),
                                   ("--trust-remote-code", args.trust_remote_code)) if on]
    if local:
        raise ConfigError(f"{', '.join(local)} apply to a local model, not to a server (--base-url)")
    return RemoteSource(**given).validate()


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


class _PaneParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # a bad pane is a settings error, not an exit
        raise ConfigError(message)


PANE_MODEL_FLAGS = ("--model", "--device", "--dtype", "--trust-remote-code", "--preset", "--base-url",
                    "--remote-model", "--api-key-env", "--remote-timeout", "--post-sampling-probs")


def settings_from_pane(base: RunSettings, spec: str) -> RunSettings:
    """One side-by-side pane's settings: ``base`` changed by ``spec``, a strategy name and options as on the
    command line (``"sample --temperature 0.7"``). Panes share the loaded model: model options are refused."""
    words = shlex.split(spec)
    if words and not words[0].startswith("-"):
        words = ["--strategy", *words]
    for word in words:
        if word.split("=")[0] in PANE_MODEL_FLAGS:
            raise ConfigError(f"pane {spec!r}: panes share the loaded model, so {word.split('=')[0]} cannot be "
                              "set per pane (use --quant METHOD for a quantized copy)")
    parser = _PaneParser(prog="pane", add_help=False)
    add_run_options(parser)
    try:
        args = parser.parse_args(words)
    except ConfigError as error:
        raise ConfigError(f"pane {spec!r}: {error}") from None
    run = base.replace(**_given(args, RunSettings))
    groups = [dataclasses.replace(base.group(cls), **_given(args, cls)) for cls in GROUPS.values()]
    try:
        return run.replace(groups=tuple(groups)).validate()
    except ConfigError as error:
        raise ConfigError(f"pane {spec!r}: {error}") from None
