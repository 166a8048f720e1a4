"""Run options for the command line: the model, the server and the preset here; the settings' own options from
their tables (``playground.config.words``).

Every registered settings group adds its own argument group; nothing here names a capability's settings.
"""

from __future__ import annotations

import argparse
from typing import Any

from playground.config import DEVICES, DTYPES, ConfigError, ModelSettings, RunSettings, rows
from playground.config.words import add_settings_options, any_settings_given, settings_from_options


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by the app, `trace` and `shot`; names mirror transformers' generation options."""
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
    add_settings_options(parser, run)


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

    named = {row.name: getattr(args, f"remote_{row.name}", None) for row in rows(RemoteSource)}
    given: dict[str, Any] = {name: value for name, value in named.items() if value not in (None, False)}
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


def settings_from_args(args: argparse.Namespace) -> tuple[ModelSettings, RunSettings]:
    """The model and run settings the options ask for: the preset's (if any), then each option given."""
    from playground.presets import load_preset

    preset = load_preset(args.preset) if args.preset else None
    path = args.model if args.model is not None or preset is None else preset.model  # a preset's bundled model
    model = ModelSettings(path=path, device=args.device, dtype=args.dtype,
                          trust_remote_code=args.trust_remote_code).validate()
    base = preset.settings if preset is not None else RunSettings()
    return model, settings_from_options(base, args).validate()


def run_options_given(args: argparse.Namespace) -> bool:
    """Whether any run option (or a preset) was given on the command line."""
    if getattr(args, "preset", None):
        return True
    return any_settings_given(args)

