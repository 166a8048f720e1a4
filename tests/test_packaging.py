"""Installed like an app (issue 34, point 5): the wheel built from the checkout's files carries the shipped
resources and both commands, an installed copy finds its resources inside itself, `--version`, and the desktop
entry `playground install-desktop` writes.

The wheel is built once (setuptools' PEP 517 hook, in a copy of the files git tracks, without build isolation:
the venv's setuptools, offline) and unpacked as pip installs a pure wheel; the installed copy is then run with the
venv's Python (its torch, Qt and the rest) and nothing of the checkout on its path. A fresh venv with pip's own
install of every dependency is the by-hand check in the issue's notes (it pulls the whole stack).
"""

from __future__ import annotations

import configparser
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from xml.etree import ElementTree

import pytest

import playground
from playground.cli import main
from playground.config import RunSettings
from playground.resources import SHIPPED

ROOT = Path(__file__).resolve().parents[1]


def _tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    return [f for f in listed if (ROOT / f).is_file() and not f.startswith(("resources/screenshots/", "tests/"))]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("checkout")
    for name in _tracked_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(ROOT / name, source / name)
        except OSError:  # another filesystem
            (source / name).write_bytes((ROOT / name).read_bytes())
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_wheel({str(dist)!r})"],
                   cwd=source, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": ""})
    (built,) = dist.glob("*.whl")
    return built


def test_the_wheel_carries_the_resources_and_both_commands(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(info).decode())
        metadata = archive.read(info.replace("entry_points.txt", "METADATA")).decode()
        for folder in SHIPPED:
            shipped = sorted(p for p in (ROOT / "resources" / folder).rglob("*") if p.is_file())
            assert shipped, folder
            for path in shipped:
                inside = f"playground/resources/{path.relative_to(ROOT / 'resources').as_posix()}"
                assert archive.read(inside) == path.read_bytes(), inside
    assert dict(entry_points["console_scripts"]) == {"playground": "playground.cli:main",
                                                     "decoding-playground": "playground.cli:main"}
    assert f"\nVersion: {playground.__version__}\n" in metadata
    assert not any(n.startswith(("tests/", "resources/", "playground/resources/screenshots")) for n in names)
    package = {p.relative_to(ROOT).as_posix() for p in (ROOT / "playground").rglob("*.py")}
    assert package <= names  # every module of the package


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("installed") / "site-packages"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)  # what pip does with a pure wheel (less the scripts, which call cli.main)
    return site


def _installed_env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1", "QT_QPA_PLATFORM": "offscreen"}


def test_an_installed_copy_runs_from_its_own_files(site, tmp_path):
    # The engine's own resource paths are the same RESOURCES_DIR (torch is left out: its import alone is seconds).
    code = ("import playground, playground.presets as p, playground.resources as r, playground.cli as c; "
            "print(playground.__file__, r.resources_dir(), len(p.all_presets()), flush=True); c.main(['--version'])")
    ran = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_installed_env(site), capture_output=True,
                         text=True)
    assert ran.returncode == 0, ran.stderr
    module, resources, presets, version = ran.stdout.split(maxsplit=3)
    assert Path(module).is_relative_to(site) and Path(resources) == site / "playground" / "resources"
    assert int(presets) == len(list((ROOT / "resources" / "presets").glob("*.json")))
    assert version.strip() == f"decoding-playground {playground.__version__}"


def test_the_installed_copy_draws_the_window(site, tmp_path, tiny_lm):
    """`shot` from the installed copy: the whole window, offscreen, on a saved run (no model to load)."""
    from playground.engine.strategies import run_strategy
    from playground.traces import write_trace

    write_trace(list(run_strategy(tiny_lm, RunSettings(prompt="Hello", max_new_tokens=4, chat=False))),
                tmp_path / "run.jsonl")
    out = tmp_path / "window.png"
    ran = subprocess.run([sys.executable, "-m", "playground", "shot", "--from-trace", "run.jsonl", "--out", str(out)],
                         cwd=tmp_path, env=_installed_env(site), capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1500, 950)


class _CaseSensitive(configparser.ConfigParser):
    def optionxform(self, optionstr: str) -> str:  # a desktop entry's keys are case-sensitive
        return optionstr


def test_install_desktop_writes_an_entry_that_runs_this_app_and_its_icon(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert main(["install-desktop"]) == 0
    entry_file, icon = (Path(p) for p in capsys.readouterr().out.split())
    assert entry_file == tmp_path / "applications" / "decoding-playground.desktop"
    entry = _CaseSensitive(interpolation=None)
    entry.read(entry_file)
    desktop = entry["Desktop Entry"]
    assert (desktop["Type"], desktop["Name"], desktop["Terminal"]) == ("Application", "Decoding Playground", "false")
    program = desktop["Exec"].split()[0].strip('"')
    assert os.access(program, os.X_OK), program  # this installation's command (or its Python)
    assert icon == tmp_path / "icons" / "hicolor" / "scalable" / "apps" / f"{desktop['Icon']}.svg"
    assert ElementTree.parse(icon).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    assert main(["install-desktop", "--uninstall"]) == 0
    assert not entry_file.exists() and not icon.exists()


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"decoding-playground {playground.__version__}"
