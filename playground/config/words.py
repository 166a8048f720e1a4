"""Settings from words: the command-line flags the settings tables declare, read into typed settings.

The command line (``playground.cli_options``) adds these options beside its own (the model, the server, the
preset); a side-by-side pane is written in the same words (``"sample --temperature 0.7"``) and read here too, so
the engine only ever receives typed settings (``pane_settings``).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import typing
from typing import Any

from playground.config.catalog import STRATEGIES
from playground.config.compare import CompareSettings
from playground.config.errors import ConfigError
from playground.config.groups import GROUPS, SettingsGroup
from playground.config.run import RunSettings
from playground.config.table import Row, rows

UNSET = None  # options left at None were not given: the preset (or the default) decides


def _add(parser: argparse._ArgumentGroup, row: Row) -> None:
    spec = row.spec
    help_text = f"{spec.help} (default: {row.default!r})" if row.default not in ((), "") else spec.help
    if row.type is bool and row.flag.startswith("--no-"):
        # argparse's on/off pair reads any "--no-..." as off: a setting whose own flag says "no" (--no-cache)
        # would be switched off by being named. It is a plain switch instead.
        parser.add_argument(row.flag, dest=row.name, action="store_const", const=True, default=UNSET,
                            help=help_text)
    elif row.type is bool:
        parser.add_argument(row.flag, dest=row.name, action=argparse.BooleanOptionalAction, default=UNSET,
                            help=help_text)
    elif row.type in (int, float, str):
        parser.add_argument(row.flag, dest=row.name, type=row.type, default=UNSET, help=help_text,
                            choices=spec.choices or None)
    else:  # a tuple of strings: repeat the flag
        parser.add_argument(row.flag, dest=row.name, action="append", default=UNSET, metavar="TEXT",
                            help=f"{spec.help} (repeatable)")


def add_settings_options(parser: argparse.ArgumentParser, generation: argparse._ArgumentGroup | None = None) -> None:
    """``--strategy`` and every table row's flag: the shared run settings in ``generation`` (made here unless
    given), then one argument group per registered settings group."""
    run = generation if generation is not None else parser.add_argument_group("generation")
    run.add_argument("--strategy", choices=tuple(STRATEGIES), default=UNSET,
                     help="; ".join(f"{s.name}: {s.help}" for s in STRATEGIES.values()))
    for row in rows(RunSettings):
        if row.spec.cli:
            _add(run, row)
    for group in GROUPS.values():
        section = parser.add_argument_group(group.title.lower())
        for row in rows(group):
            if row.spec.cli:
                _add(section, row)


def given_settings(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` (``RunSettings`` or a settings group) that the parsed options set."""
    names = [row.name for row in rows(cls) if row.spec.cli] + (["strategy"] if cls is RunSettings else [])
    values = {}
    for name in names:
        value = getattr(args, name, UNSET)
        if value is not UNSET:
            values[name] = tuple(value) if isinstance(value, list) else value
    return values


def settings_from_options(base: RunSettings, args: argparse.Namespace) -> RunSettings:
    """``base`` changed by every option given (not validated)."""
    run = base.replace(**given_settings(args, RunSettings))
    groups: list[SettingsGroup] = [dataclasses.replace(base.group(cls), **given_settings(args, cls))
                                   for cls in GROUPS.values()]
    return run.replace(groups=tuple(groups))


def any_settings_given(args: argparse.Namespace) -> bool:
    classes: tuple[type, ...] = (RunSettings, *GROUPS.values())
    return any(given_settings(args, cls) for cls in classes)


class _PaneParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # a bad pane is a settings error, not an exit
        raise ConfigError(message)


# The command line's options for the model and the preset: panes share the loaded model, so a pane refuses them.
PANE_MODEL_FLAGS = ("--model", "--device", "--dtype", "--trust-remote-code", "--preset", "--base-url",
                    "--remote-model", "--api-key-env", "--remote-timeout", "--post-sampling-probs")


def _shared_model(flag: str) -> str:
    return f"panes share the loaded model, so {flag} cannot be set per pane (use --quant METHOD for a quantized copy)"


class _RefuseModelFlag(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> typing.NoReturn:
        raise ConfigError(_shared_model(self.option_strings[0]))


def settings_from_pane(base: RunSettings, spec: str) -> RunSettings:
    """One side-by-side pane's settings: ``base`` changed by ``spec``, a strategy name and options as on the
    command line (``"sample --temperature 0.7"``). Panes share the loaded model: model options are refused."""
    words = shlex.split(spec)
    if words and not words[0].startswith("-"):
        words = ["--strategy", *words]
    for word in words:
        if word.split("=")[0] in PANE_MODEL_FLAGS:
            raise ConfigError(f"pane {spec!r}: {_shared_model(word.split('=')[0])}")
    parser = _PaneParser(prog="pane", add_help=False)
    for flag in PANE_MODEL_FLAGS:  # known, so that an abbreviation of one (--dev) is refused too, not ignored
        parser.add_argument(flag, nargs="?", action=_RefuseModelFlag)
    add_settings_options(parser)
    try:
        return settings_from_options(base, parser.parse_args(words)).validate()
    except ConfigError as error:
        raise ConfigError(f"pane {spec!r}: {error}") from None


def pane_settings(settings: RunSettings) -> list[RunSettings]:
    """Each side-by-side pane's settings: the run's own, without the side-by-side group, changed by the pane's
    words (``CompareSettings.panes``)."""
    base = settings.replace(groups=tuple(g for g in settings.groups if not isinstance(g, CompareSettings)))
    specs = settings.group(CompareSettings).panes
    panes = [settings_from_pane(base, spec) for spec in specs]
    for spec, pane in zip(specs, panes, strict=True):
        if pane.strategy == "compare":
            raise ConfigError(f"pane {spec!r}: a pane cannot itself be a side-by-side run")
    return panes
