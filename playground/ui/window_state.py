"""What the window keeps between sessions (in its ``QSettings`` store): its size and place, where its docks sit,
and the last run's settings."""

from __future__ import annotations

import json

from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtWidgets import QMainWindow

from playground.config import RunSettings

STATE_VERSION = 2  # bump when the docks change so an old saved layout is not applied to a new window


def last_run_settings(store: QSettings) -> RunSettings | None:
    """The settings the window last closed with, or None (none saved, or saved by another version)."""
    text = store.value("run/last")
    if not isinstance(text, str):
        return None
    try:
        settings, _unknown = RunSettings.from_plain_dict(json.loads(text))
        return settings.replace(forced_token_ids=()).validate()
    except (ValueError, TypeError):
        return None  # settings from another version: start from the defaults


def dock_state(window: QMainWindow) -> QByteArray:
    """Where the window's docks sit now (``restore_dock_state`` puts them back)."""
    return window.saveState(STATE_VERSION)


def restore_dock_state(window: QMainWindow, state: QByteArray) -> None:
    window.restoreState(state, STATE_VERSION)


def restore_window_state(window: QMainWindow, store: QSettings) -> None:
    """The size, place and dock layout saved when the window last closed, if any."""
    geometry, state = store.value("window/geometry"), store.value("window/state")
    if isinstance(geometry, QByteArray):
        window.restoreGeometry(geometry)
    if isinstance(state, QByteArray):
        restore_dock_state(window, state)


def save_window_state(window: QMainWindow, store: QSettings, settings: RunSettings) -> None:
    """Keep the window's size, place and dock layout, and ``settings`` for the next session."""
    store.setValue("window/geometry", window.saveGeometry())
    store.setValue("window/state", dock_state(window))
    store.setValue("run/last", json.dumps(settings.as_plain_dict()))
    store.sync()
