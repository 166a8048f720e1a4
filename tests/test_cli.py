"""Command-line routing and the app's refusal to start where Qt could not open a window."""

from __future__ import annotations

import pytest

from playground.cli import build_parser, main, settings_from_args
from playground.config import BeamSettings
from playground.ui.app import display_problem
from playground.ui.system_libs import debian_package


def test_run_options_without_a_command_go_to_the_app(capsys):
    # Bad settings are refused before any window opens, which shows the options reached the app command.
    assert main(["--prompt", "hello", "--temperature", "0"]) == 2
    assert "temperature must be above 0" in capsys.readouterr().err


def test_run_options_map_to_settings():
    args = build_parser().parse_args(["trace", "--strategy", "sample", "--top-k", "7", "--no-chat", "--stop", "\n\n",
                                      "--stop", "END", "--num-beams", "3", "--early-stopping", "never",
                                      "--dtype", "bfloat16"])
    model, run = settings_from_args(args)
    assert (run.strategy, run.top_k, run.chat, run.stop_strings) == ("sample", 7, False, ("\n\n", "END"))
    beam = run.group(BeamSettings)
    assert (beam.num_beams, beam.early_stopping, model.dtype, model.path) == (3, "never", "bfloat16", None)


def test_no_display_is_a_message_not_an_abort(monkeypatch):
    monkeypatch.setattr("sys.platform", "linux")
    for name in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    assert "no display found" in display_problem()
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert display_problem() is None


@pytest.mark.parametrize(("soname", "package"), [
    ("libxcb-cursor.so.0", "libxcb-cursor0"), ("libxcb-icccm.so.4", "libxcb-icccm4"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"), ("libxcb-render-util.so.0", "libxcb-render-util0"),
])
def test_debian_package_names(soname, package):
    assert debian_package(soname) == package


def test_shot_failures_are_messages(qapp, tmp_path, capsys, tiny_lm):
    assert main(["shot", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "x.png")]) == 2
    assert "no model at" in capsys.readouterr().err
    folder = tmp_path / "tiny"
    tiny_lm.model.save_pretrained(folder)
    tiny_lm.tokenizer.save_pretrained(folder)
    assert main(["shot", "--model", str(folder), "--prompt", "capital " * 400, "--out", str(tmp_path / "x.png")]) == 2
    assert "the run failed" in capsys.readouterr().err and not (tmp_path / "x.png").exists()
    assert main(["shot", "--model", str(folder), "--max-new-tokens", "4", "--out", str(tmp_path / "ok.png")]) == 0
    assert (tmp_path / "ok.png").stat().st_size > 10_000
