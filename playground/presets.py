"""Named demos shipped in ``resources/presets/``: a prompt, a strategy and its settings, and the view to show.

A preset file is JSON: ``{"title", "description", "view", "settings"}`` where ``settings`` is what a trace's
``start`` event holds (``RunSettings.as_plain_dict``); the file's name is the preset's name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from playground.config import ConfigError, RunSettings
from playground.config.catalog import get_strategy

PRESETS_DIR = Path(__file__).resolve().parent.parent / "resources" / "presets"


@dataclass(frozen=True)
class Preset:
    name: str
    title: str
    description: str  # what to look at, for the menu's tooltip and `playground presets`
    view: str  # the view that shows what the preset demonstrates
    settings: RunSettings


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
        preset = Preset(name, plain["title"], plain["description"], plain["view"], settings.validate())
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"preset {path} is broken: {error}") from error
    return preset


def all_presets(folder: Path = PRESETS_DIR) -> list[Preset]:
    return [load_preset(name, folder) for name in preset_names(folder)]
