"""Where the shipped files are (presets, calibration texts, steering sets, the icon): ``resources/`` beside the
package in a checkout (and an editable install), ``playground/resources/`` inside an installed wheel (setup.py's
build step copies them there).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
# What the wheel carries (setup.py reads this list; the screenshots stay in the checkout, for the README).
SHIPPED = ("calibration", "presets", "steering", "icons")


def resources_dir() -> Path:
    inside = _PACKAGE / "resources"
    return inside if inside.is_dir() else _PACKAGE.parent / "resources"


RESOURCES_DIR = resources_dir()
