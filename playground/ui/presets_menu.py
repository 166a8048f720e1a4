"""The Presets menu: the named demos (``resources/presets/``), each putting its prompt and settings in the form and
its view in front."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from PySide6.QtWidgets import QDockWidget, QMenuBar, QStatusBar

from playground.config import ConfigError, RunSettings
from playground.ui.banner import MessageBanner


def add_presets_menu(menu_bar: QMenuBar, run_preset: Callable[[str], None], banner: MessageBanner) -> None:
    """An entry per preset (its description as the tooltip) that calls ``run_preset`` with its name; presets that
    cannot be read leave the menu empty and say why in ``banner``."""
    from playground.presets import all_presets

    presets_menu = menu_bar.addMenu("&Presets")
    try:
        presets = all_presets()
    except ConfigError as error:
        presets = []
        banner.show_error(str(error))
    for preset in presets:
        def run_this(name: str = preset.name) -> None:
            run_preset(name)

        action = presets_menu.addAction(preset.title, run_this)
        action.setToolTip(preset.description)
        action.setStatusTip(preset.description)
    presets_menu.setToolTipsVisible(True)


def show_preset(name: str, set_run_settings: Callable[[RunSettings], None], docks: Mapping[str, QDockWidget],
                banner: MessageBanner, status: QStatusBar, loaded: str | None = None,
                load_model: Callable[[str], None] | None = None) -> bool:
    """Put preset ``name``'s prompt and settings in the form and its view's dock in front; False (and the reason in
    ``banner``) when it cannot be read, or when it is written for a bundled model other than ``loaded`` (the banner
    then offers ``load_model`` of it)."""
    from playground.presets import load_preset

    try:
        preset = load_preset(name)
    except ConfigError as error:
        banner.show_error(str(error))
        return False
    set_run_settings(preset.settings)
    if preset.view in docks:
        docks[preset.view].show()
        docks[preset.view].raise_()
    status.showMessage(f"Preset: {preset.title} — {preset.description}", 15000)
    model = preset.model
    if model is not None and loaded != model:
        action = None
        if load_model is not None:
            load = load_model
            action = (f"Load {model}", lambda: load(model))
        banner.show_info(f"“{preset.title}” is written for {model} (the loaded model is {loaded or 'none'}).", action)
        return False
    return True
