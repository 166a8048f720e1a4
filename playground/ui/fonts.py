"""Fonts for every script: find uncovered characters, and install a CJK font where none is installed.

Qt falls back through the installed fonts for characters the widget's font lacks, so Chinese renders as soon as
one installed font covers it; Debian's minimal images have none (only DejaVu), and Chinese text turns into boxes.
``python -m playground.ui.fonts --install`` installs one with apt-get when none covers Chinese (used by the set-up
of `make run` and `make test`); ``uncovered_characters`` tells a screenshot which characters no font can draw.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import unicodedata
from collections.abc import Iterable
from functools import cache

CJK_PACKAGE = "fonts-wqy-microhei"  # ~5 MB; fonts-noto-cjk is fuller but ~60 MB


def cjk_font_installed() -> bool:
    """Whether fontconfig knows a font that covers Chinese (without starting Qt)."""
    if shutil.which("fc-list") is None:
        return False
    out = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, check=False).stdout
    return bool(out.strip())


def install_cjk_font() -> int:
    """Install a CJK font with apt-get if none is installed (idempotent); 0 when one is there afterwards."""
    if cjk_font_installed():
        return 0
    if shutil.which("apt-get") is None:
        print(f"No installed font covers Chinese: install one (e.g. Debian's {CJK_PACKAGE}) or CJK text will be "
              "drawn as boxes", file=sys.stderr)
        return 1
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    print(f"Installing a font that covers Chinese: {CJK_PACKAGE}", flush=True)
    install = [*sudo, "apt-get", "install", "-y", "--no-install-recommends", CJK_PACKAGE]
    if subprocess.run(install, check=False).returncode != 0:
        subprocess.run([*sudo, "apt-get", "update"], check=False)
        subprocess.run(install, check=False)
    if shutil.which("fc-cache"):
        subprocess.run(["fc-cache", "-f"], check=False, capture_output=True)
    if cjk_font_installed():
        return 0
    print(f"Could not install {CJK_PACKAGE}: CJK text will be drawn as boxes", file=sys.stderr)
    return 1


def _needs_glyph(ch: str) -> bool:
    # Spaces, controls and format characters draw nothing, whatever the font.
    return not ch.isspace() and unicodedata.category(ch)[0] not in ("C", "Z")


@cache
def _families() -> tuple:
    from PySide6.QtGui import QFont, QFontDatabase, QFontMetrics

    return tuple(QFontMetrics(QFont(family)) for family in QFontDatabase.families())


@cache
def covered(ch: str) -> bool:
    """Whether any installed font has a glyph for ``ch`` (what Qt's font fallback can reach). Needs a QApplication."""
    return any(metrics.inFontUcs4(ord(ch)) for metrics in _families())


def uncovered_characters(texts: Iterable[str]) -> list[str]:
    """The characters of ``texts`` that no installed font can draw, in order of first appearance."""
    seen: dict[str, None] = {}
    for text in texts:
        for ch in text:
            if ch not in seen and _needs_glyph(ch) and not covered(ch):
                seen[ch] = None
    return list(seen)


def describe(chars: list[str], limit: int = 12) -> str:
    shown = ", ".join(f"{ch} (U+{ord(ch):04X})" for ch in chars[:limit])
    return shown + (f" and {len(chars) - limit} more" if len(chars) > limit else "")


def main() -> int:
    if "--install" in sys.argv:
        return install_cjk_font()
    return 0 if cjk_font_installed() else 1


if __name__ == "__main__":
    raise SystemExit(main())
