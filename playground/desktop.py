"""``playground install-desktop``: the app in the desktop's menus, per the freedesktop.org specifications: a
``decoding-playground.desktop`` entry under ``$XDG_DATA_HOME/applications`` (``~/.local/share``) that runs this
installation's ``decoding-playground`` command, and its icon under ``icons/hicolor/scalable/apps``. Nothing is
written outside the user's data folder; ``--uninstall`` removes both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from playground import __version__
from playground.errors import UserError
from playground.resources import resources_dir

APP_ID = "decoding-playground"


class DesktopError(UserError, OSError):
    """The desktop entry could not be written; the message says where and why."""


def data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share").expanduser()


def entry_path() -> Path:
    return data_home() / "applications" / f"{APP_ID}.desktop"


def icon_path() -> Path:
    return data_home() / "icons" / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg"


def app_command() -> list[str]:
    """How to start this installation's app: its ``decoding-playground`` script beside this Python, else on PATH,
    else ``python -m playground``."""
    beside = Path(sys.executable).parent / APP_ID
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which(APP_ID)
    return [found] if found else [sys.executable, "-m", "playground"]


def desktop_entry(command: list[str]) -> str:
    exec_line = " ".join(_desktop_quote(part) for part in command)
    return (
        "[Desktop Entry]\n"
        "Type=Application\n"
        "Version=1.5\n"
        "Name=Decoding Playground\n"
        "GenericName=Language model decoding lab\n"
        "Comment=Watch, steer and compare how a language model decodes, live\n"
        f"Exec={exec_line}\n"
        f"Icon={APP_ID}\n"
        "Terminal=false\n"
        "Categories=Education;Science;ArtificialIntelligence;Development;\n"
        "Keywords=LLM;language model;decoding;sampling;beam search;GGUF;\n"
        "StartupNotify=true\n"
        f"StartupWMClass={APP_ID}\n"
        f"X-Decoding-Playground-Version={__version__}\n"
    )


def _desktop_quote(part: str) -> str:
    """An Exec argument, quoted as the Desktop Entry spec asks (double quotes; \\, ", ` and $ escaped)."""
    if part and not any(c in part for c in ' \t\n"\'\\><~|&;$*?#()`'):
        return part
    return '"' + "".join("\\" + c if c in '"`$\\' else c for c in part) + '"'


def install_desktop() -> list[Path]:
    """Write the entry and the icon; return their paths."""
    icon_source = resources_dir() / "icons" / f"{APP_ID}.svg"
    try:
        icon_path().parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(icon_source, icon_path())
        entry_path().parent.mkdir(parents=True, exist_ok=True)
        entry_path().write_text(desktop_entry(app_command()), encoding="utf-8")
    except OSError as error:
        raise DesktopError(f"could not install the desktop entry under {data_home()}: {error}") from error
    _refresh(entry_path().parent, ["update-desktop-database", "-q"])
    return [entry_path(), icon_path()]


def uninstall_desktop() -> list[Path]:
    removed = []
    for path in (entry_path(), icon_path()):
        if path.is_file():
            path.unlink()
            removed.append(path)
    return removed


def _refresh(folder: Path, command: list[str]) -> None:
    """The desktop's menu cache, where its tool is installed (menus also notice new entries on their own)."""
    if shutil.which(command[0]):
        subprocess.run([*command, str(folder)], check=False, capture_output=True, timeout=30)


