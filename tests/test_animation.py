"""A saved run as an animation (``shot --from-trace RUN --out run.gif``, File ▸ Export animation) and presentation
mode (View ▸ Present): the frames, their pace, their pixels and the steps, checked against the run's events and
against the window rendered at that step here."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageSequence
from PySide6.QtCore import Qt
from windows import open_window

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.errors import ScreenshotError
from playground.events import PrefillDone, TokenStep
from playground.state import flowing_token_text
from playground.traces import write_trace
from playground.ui.animation import export_animation, to_pillow
from playground.ui.replay import Replay
from playground.ui.screenshot import render_animation

SIZE = (900, 560)  # the tokens view's frame: as small as its chart and text lay out at their ease


@pytest.fixture(scope="module")
def saved(tiny_lm, tmp_path_factory):
    events = list(run_strategy(tiny_lm, RunSettings.from_flat(prompt="Once upon a time", max_new_tokens=6,
                                                              strategy="greedy", chat=False)))
    path = tmp_path_factory.mktemp("animation") / "run.jsonl"
    write_trace(events, path)
    return path, events


@pytest.fixture(scope="module")
def webp(saved, tmp_path_factory):
    """The tokens view's lossless animation of the saved run, its frames decoded."""
    path, _events = saved
    out = tmp_path_factory.mktemp("webp") / "run.webp"
    result, problems = render_animation(path, out, *SIZE, view="tokens", hover=False, quiet=True)
    assert not problems and result.path == out
    with Image.open(out) as image:
        return [np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)]


def rendered_here(qtbot, tmp_path, events, position: int, view: str = "tokens") -> np.ndarray:
    """The view at frame ``position``, drawn by a window of this test straight from the events up to there (the
    export went step by step)."""
    from playground.ui.animation import _float_view

    w = open_window(qtbot, tmp_path, size=(1000, 700), name=f"w{position}.ini")
    replay = Replay(w.run_views, events, settle_in=w)
    _float_view(w.docks[view], w.views[view], SIZE)
    replay.show(position)
    pixels = np.asarray(to_pillow(w.views[view].grab()))
    w.close()
    return pixels


def steps_of(events) -> list[TokenStep]:
    return [e for e in events if isinstance(e, TokenStep)]


def output_text(steps: list[TokenStep]) -> str:
    """The tokens as the output shows them (line breaks marked, an empty delta as a dot)."""
    return "".join(flowing_token_text(s.text) if s.text else "·" for s in steps)


def test_a_frame_per_step_each_the_view_at_that_step(saved, webp, qtbot, tmp_path):
    _path, events = saved
    steps = steps_of(events)
    assert len(webp) == 1 + len(steps)  # the prompt, then each token
    assert webp[0].shape == (SIZE[1], SIZE[0], 3)
    assert all((webp[k] != webp[k + 1]).any() for k in range(len(steps)))  # each step changes the picture
    for position in (2, len(steps)):  # a step mid-run and the end: pixel for pixel (WebP is lossless)
        assert np.array_equal(webp[position], rendered_here(qtbot, tmp_path, events, position))


def test_the_replay_shows_the_prompt_and_the_tokens_up_to_each_frame(saved, qtbot, tmp_path):
    _path, events = saved
    steps = steps_of(events)
    w = open_window(qtbot, tmp_path, size=(900, 600))
    replay = Replay(w.run_views, events, settle_in=w)
    shown = w.views["tokens"].token_view.text
    prompt = events[0].prompt_text
    for position in (0, 3, 1, len(steps)):  # forward, back (rebuilt), to the end
        replay.show(position)
        assert shown.toPlainText().replace("\u2029", "\n") == prompt + output_text(steps[:position])
        assert w.views["tokens"].chart_index == (position - 1 if 0 < position < len(steps) else
                                                 w.views["tokens"].chart_index)
    assert replay.run is not None and replay.run.finished is not None  # the last frame is the ended run


def test_the_gif_keeps_the_run_s_pace_and_each_frame_s_pixels_in_its_palette(saved, qtbot, tmp_path):
    path, events = saved
    steps = steps_of(events)
    prefill_ms = next(e.prefill_ms for e in events if isinstance(e, PrefillDone))
    out = tmp_path / "run.gif"
    render_animation(path, out, *SIZE, view="tokens", hover=False, speed=0.1, quiet=True)

    def gif_ms(ms: float) -> int:  # GIF's 10 ms steps, at least 20 ms
        return max(20, round(ms / 10) * 10)

    shown = [prefill_ms + steps[0].step_ms] + [s.step_ms for s in steps[1:]]
    with Image.open(out) as gif:
        palette = Image.new("P", (1, 1))
        palette.putpalette(gif.getpalette())  # the one palette every frame uses
        frames = [(np.asarray(frame.convert("RGB")), frame.info["duration"]) for frame in ImageSequence.Iterator(gif)]
    assert [ms for _pixels, ms in frames] == [gif_ms(ms * 10) for ms in shown] + [2000]  # 1/10 the speed
    position = 3
    here = Image.fromarray(rendered_here(qtbot, tmp_path, events, position))
    expected = np.asarray(here.quantize(palette=palette, dither=Image.Dither.NONE).convert("RGB"))
    assert np.array_equal(frames[position][0], expected)

    render_animation(path, out, *SIZE, view="tokens", hover=False, fps=4, quiet=True)
    with Image.open(out) as gif:
        assert [frame.info["duration"] for frame in ImageSequence.Iterator(gif)] == [250] * len(steps) + [2000]


def decoded_mp4(path) -> tuple[list[np.ndarray], list[float]]:
    """The MP4's frames (RGB) and each one's start time (s), decoded by the same ffmpeg program."""
    import re
    import subprocess

    from playground.ui.animation import ffmpeg_program

    done = subprocess.run([ffmpeg_program(), "-loglevel", "info", "-i", str(path), "-fps_mode", "passthrough",
                           "-vf", "showinfo", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:"],
                          capture_output=True, check=True)
    starts = [float(t) for t in re.findall(r"pts_time:([0-9.]+)", done.stderr.decode())]
    width, height = SIZE
    raw = np.frombuffer(done.stdout, dtype=np.uint8)
    return list(raw.reshape(-1, height, width, 3)), starts


def test_the_mp4_holds_a_frame_per_step_at_the_run_s_pace_and_stop_writes_none(saved, qtbot, tmp_path):
    """Through ffmpeg (on PATH, or imageio-ffmpeg's, which the test extra installs): a frame per step, each as
    long as the step took (at a tenth of the speed), each close to the view drawn here at that step (yuv420p
    blurs colours, so not exact)."""
    path, events = saved
    steps = steps_of(events)
    prefill_ms = next(e.prefill_ms for e in events if isinstance(e, PrefillDone))
    out = tmp_path / "run.mp4"
    render_animation(path, out, *SIZE, view="tokens", hover=False, speed=0.1, quiet=True)
    frames, starts = decoded_mp4(out)
    # A frame per step after the prompt's, and a copy of the last at the end of its 2 s hold (the concat demuxer
    # keeps the last frame's duration only so): the video lasts the GIF's time.
    # A frame per step after the prompt's, and a copy of the last at the end of its 2 s hold (the concat demuxer
    # keeps the last frame's duration only so; H.264 decodes the copy within a grey level of the original).
    assert len(frames) == len(steps) + 2
    assert np.abs(frames[-1].astype(float) - frames[-2]).mean() < 0.5
    shown_ms = [prefill_ms + steps[0].step_ms] + [s.step_ms for s in steps[1:]]
    expected_starts = np.cumsum([0] + [max(20, round(ms * 10 / 10) * 10) for ms in shown_ms]) / 1000
    assert starts[:-1] == pytest.approx(list(expected_starts), abs=0.002)
    assert starts[-1] - starts[-2] == pytest.approx(2.0, abs=0.05)
    here = rendered_here(qtbot, tmp_path, events, 2).astype(float)
    difference = np.abs(frames[2].astype(float) - here)
    assert difference.mean() < 3 and np.percentile(difference, 99) < 40
    # ... and further from the frames before and after it (the step is told apart, not just any frame).
    for other in (1, len(steps)):
        assert np.abs(frames[other].astype(float) - here).mean() > 2 * difference.mean(), other

    w = open_window(qtbot, tmp_path, size=(900, 600))
    done: list[int] = []
    stopped = tmp_path / "stopped.mp4"
    result = export_animation(w, events, stopped, view="tokens", progress=lambda k, n: done.append(k),
                              should_stop=lambda: len(done) >= 2)
    assert result is None and done == [1, 2] and not stopped.exists() and not list(tmp_path.glob("*.part"))


def test_without_any_ffmpeg_an_mp4_is_refused_by_name_before_anything_runs(monkeypatch, tmp_path):
    import shutil
    import sys

    from playground.ui.animation import check_output

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # as if not installed: importing it fails
    with pytest.raises(ScreenshotError, match="needs the ffmpeg program"):
        check_output(tmp_path / "run.mp4")
    check_output(tmp_path / "run.gif")  # the others need nothing


def test_stop_writes_nothing_and_bad_requests_say_why(saved, qtbot, tmp_path):
    _path, events = saved
    w = open_window(qtbot, tmp_path, size=(900, 600))
    done: list[int] = []
    out = tmp_path / "stopped.gif"
    result = export_animation(w, events, out, view="tokens", progress=lambda k, n: done.append(k),
                              should_stop=lambda: len(done) >= 2)
    assert result is None and done == [1, 2] and not out.exists() and not list(tmp_path.glob("*.part"))
    for target, options, words in [
        ("run.avi", {}, "a .gif, .webp or .mp4 file"),
        ("run.gif", {"fps": 0.0}, "--fps must be above 0"),
        ("run.gif", {"speed": -1.0}, "--speed must be above 0"),
        ("run.gif", {"max_frames": 3}, f"makes {len(steps_of(events)) + 1} frames, over the budget of 3"),
        ("run.gif", {"view": "nope"}, "no view named 'nope'"),
    ]:
        with pytest.raises(ScreenshotError, match=words.replace(".", r"\.").replace("(", r"\(")):
            export_animation(w, events, tmp_path / target, **options)
        assert not (tmp_path / target).exists()


def test_the_command_line_animates_a_saved_run_and_only_a_saved_run(saved, tmp_path, capsys):
    from playground.cli import main

    path, events = saved
    out = tmp_path / "cli.webp"
    assert main(["shot", "--from-trace", str(path), "--out", str(out), "--view", "tokens", "--width", "900",
                 "--height", "560", "--no-hover", "--fps", "10"]) == 0
    err = capsys.readouterr().err
    assert f"{len(steps_of(events)) + 1} frames of the tokens view, 900×560" in err and "MB, in" in err
    with Image.open(out) as image:
        assert image.n_frames == len(steps_of(events)) + 1 and image.size == (900, 560)
    assert main(["shot", "--out", str(tmp_path / "live.gif")]) == 2
    assert "an animation replays a saved run" in capsys.readouterr().err


def test_present_steps_through_the_run_in_large_type_and_gives_the_window_back(saved, qtbot, tmp_path):
    path, events = saved
    steps = steps_of(events)
    w = open_window(qtbot, tmp_path, size=(900, 600))
    assert not w.presenter.enter()  # nothing to present yet
    assert "steps through a run that has ended" in w.banner.label.text()
    w.open_run(path)
    view = w.views["tokens"]
    shown = view.token_view.text
    point_size = view.chart.header.font().pointSizeF()
    axis = view.chart.plot.getPlotItem().getAxis("bottom")
    assert axis.style["tickFont"] is None  # the chart's own default
    assert w.presenter.enter()
    assert axis.style["tickFont"].pointSizeF() == pytest.approx(view.chart.plot.font().pointSizeF() * 1.6)
    assert not w.settings_dock.isVisible() and not w.runs_dock.isVisible() and w.docks["tokens"].isVisible()
    assert view.chart.header.font().pointSizeF() == pytest.approx(point_size * 1.6)

    def text() -> str:
        return shown.toPlainText().replace("\u2029", "\n").removeprefix(events[0].prompt_text)

    assert text() == ""
    for _ in range(3):
        qtbot.keyClick(w, Qt.Key.Key_Right)
    assert text() == output_text(steps[:3]) and "step 3" in w.status.currentMessage()
    qtbot.keyClick(w, Qt.Key.Key_Left)
    assert text() == output_text(steps[:2])
    qtbot.keyClick(w, Qt.Key.Key_End)
    assert text() == output_text(steps)
    qtbot.keyClick(w, Qt.Key.Key_Escape)
    assert not w.presenter.active and w.settings_dock.isVisible() and w.runs_dock.isVisible()
    assert view.chart.header.font().pointSizeF() == pytest.approx(point_size)
    assert axis.style["tickFont"] is None
    assert text() == output_text(steps)


def test_file_export_animation_replays_the_selected_run_away_from_the_window(saved, qtbot, tmp_path):
    from playground.ui.animation_dialog import export_selected_run

    path, events = saved
    w = open_window(qtbot, tmp_path, size=(1000, 700))
    w.open_run(path)
    text_before = w.views["tokens"].token_view.text.toPlainText()
    result = export_selected_run(w, tmp_path / "window.gif")
    assert result is not None and result.frames == len(steps_of(events)) + 1
    with Image.open(result.path) as gif:
        assert gif.size == (1000, 700) and gif.n_frames == result.frames
    assert w.views["tokens"].token_view.text.toPlainText() == text_before  # the user's window was left alone
    assert "frames" in w.status.currentMessage()
