"""System libraries Qt's X11 plugin needs but pip cannot install (Qt >= 6.5 wants libxcb-cursor0 and friends).

Without them Qt aborts the whole process when it opens a window; we find out first with ``ldd`` and say what to
install. ``python -m playground.ui.system_libs --install`` installs them with apt-get (used by ``make run``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def xcb_plugin() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("PySide6")
    if spec is None or spec.origin is None:
        return None
    plugin = Path(spec.origin).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return plugin if plugin.is_file() else None


def missing_libraries(plugin: Path | None = None) -> list[str]:
    """Sonames the X11 platform plugin (and its Qt library) cannot find, e.g. ``libxcb-cursor.so.0``."""
    plugin = plugin or xcb_plugin()
    if plugin is None or not sys.platform.startswith("linux") or shutil.which("ldd") is None:
        return []
    targets = [plugin, *plugin.parents[2].joinpath("lib").glob("libQt6XcbQpa.so*")]
    missing: set[str] = set()
    for target in targets:
        out = subprocess.run(["ldd", str(target)], capture_output=True, text=True, check=False).stdout
        missing.update(re.findall(r"^\s*(\S+) => not found", out, flags=re.MULTILINE))
    if "libxcb-cursor.so.0" not in missing and not _found("libxcb-cursor.so.0"):
        missing.add("libxcb-cursor.so.0")  # loaded at run time, so ldd does not list it
    return sorted(missing)


def _found(soname: str) -> bool:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    return soname in out


def debian_package(soname: str) -> str:
    """Debian's package for a soname: ``libxcb-icccm.so.4`` -> ``libxcb-icccm4``, ``libxkbcommon-x11.so.0`` ->
    ``libxkbcommon-x11-0`` (a hyphen goes before the version when the name ends in a digit)."""
    name, _, version = soname.partition(".so.")
    version = version.split(".")[0]
    return f"{name}-{version}" if name[-1].isdigit() else f"{name}{version}"


def install_command(packages: list[str]) -> list[str]:
    prefix = [] if os.geteuid() == 0 else ["sudo"]
    return [*prefix, "apt-get", "install", "-y", "--no-install-recommends", *packages]


def main() -> int:
    missing = missing_libraries()
    if not missing:
        return 0
    packages = sorted({debian_package(s) for s in missing})
    if "--install" in sys.argv and shutil.which("apt-get"):
        print(f"Installing what Qt needs to open windows: {' '.join(packages)}", flush=True)
        if subprocess.run(install_command(packages), check=False).returncode != 0:
            update = ([] if os.geteuid() == 0 else ["sudo"]) + ["apt-get", "update"]
            subprocess.run(update, check=False)
            subprocess.run(install_command(packages), check=False)
        missing = missing_libraries()
        if not missing:
            return 0
    print(f"Qt cannot open windows without: {', '.join(missing)} "
          f"(Debian/Ubuntu packages: {' '.join(packages)})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
