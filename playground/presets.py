"""Named demos shipped in ``resources/presets/``: a prompt, a strategy and its settings, and the view to show.

A preset file is JSON: ``{"title", "description", "view", "settings"}`` (and ``"model"``, a bundled model's name, for
a preset written for one) where ``settings`` is what a trace's
``start`` event holds (``RunSettings.as_plain_dict``); the file's name is the preset's name. A long prompt can come
from shipped text files: ``"prompt_from": {"files": ["calibration/calibration.txt", ...], "chars": 9600}`` (paths
under ``resources/``, joined by blank lines, cut to ``chars`` at a word's end) comes before the settings' own
prompt, which then says what to do with the text. A steering vector (``"steering": {"steer": ["FILE:STRENGTH"]}``)
written as a relative path is a shipped one, under ``resources/``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from playground.config import ConfigError, RunSettings
from playground.config.catalog import get_strategy
from playground.resources import RESOURCES_DIR

PRESETS_DIR = RESOURCES_DIR / "presets"


@dataclass(frozen=True)
class Preset:
    name: str
    title: str
    description: str  # what to look at, for the menu's tooltip and `playground presets`
    view: str  # the view that shows what the preset demonstrates
    settings: RunSettings
    # The bundled model it is written for (``"model": "gemma-3-270m"``), None for the default one or any model:
    # the command line loads it unless --model says otherwise; the window offers to.
    model: str | None = None


def preset_names(folder: Path = PRESETS_DIR) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.json"))


def load_preset(name: str, folder: Path = PRESETS_DIR) -> Preset:
    path = folder / f"{name}.json"
    if not path.is_file():
        known = ", ".join(preset_names(folder)) or "none"
        raise ConfigError(f"no preset named {name!r} (known: {known})")
    try:
        plain = json.loads(path.read_text(encoding="utf-8"))
        settings, unknown = RunSettings.from_plain_dict(plain["settings"])
        if unknown:
            raise ValueError(f"unknown settings {', '.join(unknown)}")
        get_strategy(settings.strategy)
        if "prompt_from" in plain:
            text = prompt_from_files(plain["prompt_from"])
            settings = dataclasses.replace(settings, prompt=f"{text}\n\n{settings.prompt}" if settings.prompt
                                           else text)
        settings = shipped_vectors(settings)
        model = plain.get("model")
        if model is not None:
            from playground.models.bundled import bundled_keys

            if model not in bundled_keys():
                raise ValueError(f"model {model!r} is not a bundled model ({', '.join(bundled_keys())})")
        preset = Preset(name, plain["title"], plain["description"], plain["view"], settings.validate(), model)
    except (ValueError, KeyError, TypeError, OSError) as error:
        raise ConfigError(f"preset {path} is broken: {error}") from error
    return preset


def all_presets(folder: Path = PRESETS_DIR) -> list[Preset]:
    return [load_preset(name, folder) for name in preset_names(folder)]


def shipped_vectors(settings: RunSettings) -> RunSettings:
    """A preset's ``--steer`` files written as relative paths are shipped vectors: paths under ``resources/``."""
    from playground.config.steering import SteeringSettings

    steering = settings.group(SteeringSettings)
    if not steering.steer or all(Path(path).is_absolute() for path, _ in steering.specs()):
        return settings
    specs = tuple(f"{path if Path(path).is_absolute() else RESOURCES_DIR / path}:{strength!r}"
                  for path, strength in steering.specs())
    groups = tuple(dataclasses.replace(g, steer=specs) if isinstance(g, SteeringSettings) else g
                   for g in settings.groups)
    return dataclasses.replace(settings, groups=groups)


def prompt_from_files(spec: dict) -> str:
    """The text of ``spec["files"]`` (under resources/, joined by blank lines), cut to ``spec["chars"]`` characters
    at the end of a word when given."""
    text = "\n\n".join((RESOURCES_DIR / name).read_text(encoding="utf-8").strip() for name in spec["files"])
    chars = spec.get("chars")
    if chars is not None and len(text) > chars:
        text = text[:chars].rsplit(None, 1)[0]
    return text
