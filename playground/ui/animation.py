"""A saved run as an animation: the window (or one view) replayed step by step as it streamed, each frame a
grab of the real widgets, encoded as GIF or WebP with Pillow, or as MP4 where an ``ffmpeg`` program is found (on
PATH, or the one the imageio-ffmpeg package carries).

The pace is the run's own (each frame stays as long as the next step took, times ``speed``) or a fixed ``fps``.
GIF keeps 256 colours a frame (one palette for the whole run, no dithering: text stays crisp) and delays in 10 ms
steps; WebP is lossless, so its frames are the grabs exactly.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from playground.errors import ScreenshotError

FORMATS = (".gif", ".webp", ".mp4")
MIN_DELAY_MS = 20  # browsers show a GIF frame of less than 20 ms for 100 ms
MAX_DELAY_MS = 10_000
MAX_FRAMES = 2000  # the budget a run must fit unless the caller raises it (--max-frames)


@dataclass(frozen=True)
class AnimationPlan:
    """What an export will make, stated before it starts."""

    frames: int
    width: int
    height: int
    seconds: float  # the animation's length once (its last frame's hold included)
    view: str | None

    def describe(self) -> str:
        what = f"the {self.view} view" if self.view else "the window"
        return (f"{self.frames} frames of {what}, {self.width}×{self.height}, {self.seconds:.1f} s long "
                f"(the budget: at most {MAX_FRAMES} frames unless --max-frames says more)")


@dataclass(frozen=True)
class AnimationResult:
    path: Path
    frames: int
    bytes: int
    seconds: float  # the time the export took


def frame_delays(recorded_ms: list[float], fps: float | None, speed: float) -> list[int]:
    """Each frame's time on screen in ms: the recorded pace over ``speed``, or ``1000 / fps``; rounded to the
    10 ms steps GIF keeps and clamped to [20 ms, 10 s] (the last frame's hold is kept as recorded)."""
    if fps is not None and not fps > 0:
        raise ScreenshotError(f"--fps must be above 0, not {fps}")
    if not speed > 0:
        raise ScreenshotError(f"--speed must be above 0, not {speed}")
    delays = []
    for k, ms in enumerate(recorded_ms):
        last = k == len(recorded_ms) - 1
        shown = ms if last else (1000.0 / fps if fps is not None else ms / speed)
        delays.append(int(min(MAX_DELAY_MS, max(MIN_DELAY_MS, round(shown / 10.0) * 10))))
    return delays


def to_pillow(pixmap):
    """A ``QPixmap`` as a Pillow RGB image (its rows copied out of Qt's padded buffer)."""
    from PIL import Image
    from PySide6.QtGui import QImage

    image = pixmap.toImage().convertToFormat(QImage.Format.Format_RGB888)
    return Image.frombuffer("RGB", (image.width(), image.height()), bytes(image.constBits()), "raw", "RGB",
                            image.bytesPerLine(), 1).copy()


TRANSPARENT = 255  # the palette index of "as the frame before" (GIF frames are drawn over the previous one)


def gif_palette(samples: list):
    """One palette of 255 colours for every frame (median cut over ``samples``, e.g. the first, middle and last
    frames side by side): a pixel that stays the same keeps its index, so each frame stores only what changed."""
    from PIL import Image

    width, height = samples[0].size
    sheet = Image.new("RGB", (width, height * len(samples)))
    for k, sample in enumerate(samples):
        sheet.paste(sample, (0, height * k))
    palette = sheet.quantize(colors=TRANSPARENT, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    colours = (palette.getpalette() or [])[:3 * TRANSPARENT]
    palette.putpalette(colours + [0, 0, 0] * (256 - len(colours) // 3))
    return palette


def quantised(rgb, palette):
    """``rgb`` in ``palette``'s colours, each pixel its nearest, no dithering (text stays crisp)."""
    from PIL import Image

    return rgb.quantize(palette=palette, dither=Image.Dither.NONE)


UNCHANGED_RUN = 16  # the shortest run of unchanged pixels in a row that a GIF frame leaves transparent


def lasting(same, shortest: int = UNCHANGED_RUN):
    """Where ``same`` (rows × columns, bool) holds in runs of at least ``shortest`` along a row."""
    import numpy as np

    rows, columns = same.shape
    padded = np.concatenate([same, np.zeros((rows, 1), dtype=bool)], axis=1).ravel()  # a run ends with its row
    run = np.cumsum(~padded)  # each run of True shares the number of the False before it
    length = np.bincount(run, weights=padded)
    return (padded & (length[run] >= shortest)).reshape(rows, columns + 1)[:, :columns]


class GifFrames:
    """Frames as GIF stores them: the palette's colours, and the pixels the frame before already showed made
    transparent (drawn over it: ``disposal=1``), which LZW packs to almost nothing. Only runs of at least
    ``UNCHANGED_RUN`` such pixels: a few unchanged pixels amid changed ones (inside a new number) cost LZW more as
    a switch to transparent and back than as their own colour (4.63 against 4.94 MB for a 200-step GIF)."""

    def __init__(self, palette) -> None:
        self.palette, self._before = palette, None

    def __call__(self, rgb):
        import numpy as np
        from PIL import Image

        indices = np.asarray(quantised(rgb, self.palette))
        frame = indices.copy()
        if self._before is not None:
            frame[lasting(indices == self._before)] = TRANSPARENT
        self._before = indices
        image = Image.fromarray(frame, mode="P")
        image.putpalette(self.palette.getpalette())
        image.info["transparency"] = TRANSPARENT
        return image


def ffmpeg_program() -> str | None:
    """The ``ffmpeg`` to encode MP4 with: one on PATH, else the one the ``imageio-ffmpeg`` package carries where it
    is installed (the well-kept binding that ships a static build), else none."""
    found = shutil.which("ffmpeg")
    if found is not None:
        return found
    try:
        import imageio_ffmpeg
    except ImportError:
        return None
    try:
        return str(imageio_ffmpeg.get_ffmpeg_exe())
    except RuntimeError:  # the package without a binary for this platform
        return None


def _encode_mp4(path: Path, frames: Iterator, delays: list[int]) -> None:
    """Through ``ffmpeg``: each frame written as a PNG with its duration as it comes (the concat demuxer), so a
    long run is never held in memory; a run stopped before its last frame writes nothing."""
    ffmpeg = ffmpeg_program()
    if ffmpeg is None:
        raise ScreenshotError(NO_FFMPEG)
    with tempfile.TemporaryDirectory() as tmp:
        lines, name = [], ""
        for k, frame in enumerate(frames):
            name = f"{k:06d}.png"
            frame.save(Path(tmp) / name, compress_level=1)
            # A still read at 1000 frames a second: its time base is 1 ms, not the image reader's 1/25 s
            lines.append(f"file '{name}'\noption framerate 1000\nduration {delays[k] / 1000:.3f}\n")
        if len(lines) < len(delays):
            return  # stopped: the caller deletes the partial file
        lines.append(f"file '{name}'\noption framerate 1000\n")  # else the concat demuxer drops the last duration
        (Path(tmp) / "frames.txt").write_text("".join(lines), encoding="utf-8")
        done = subprocess.run([ffmpeg, "-y", "-loglevel", "error", "-f", "concat", "-safe", "0", "-i", "frames.txt",
                               "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", "-pix_fmt", "yuv420p",
                               "-fps_mode", "passthrough", "-enc_time_base", "1/1000", "-video_track_timescale", "1000",
                               "-f", "mp4", str(path.resolve())], cwd=tmp, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise ScreenshotError(f"ffmpeg could not write {path.name}: {done.stderr.strip()[-300:]}")


NO_FFMPEG = ("an .mp4 needs the ffmpeg program, which is not installed: write a .gif or .webp, or install ffmpeg "
             "(e.g. Debian's ffmpeg package, or pip install imageio-ffmpeg)")


def check_output(path: Path) -> None:
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise ScreenshotError(f"an animation is a .gif, .webp or .mp4 file, not {path.name}")
    if suffix == ".mp4" and ffmpeg_program() is None:
        raise ScreenshotError(NO_FFMPEG)


def _float_view(dock, view, size: tuple[int, int] | None) -> None:
    """One view on its own, ``size`` (the window's when None): its dock floated out of the window and sized so that
    the view inside is exactly that big."""
    from PySide6.QtCore import QCoreApplication

    dock.show()
    dock.raise_()
    if size is None:
        return
    dock.setFloating(True)
    dock.resize(*size)
    QCoreApplication.processEvents()
    for _ in range(3):  # the dock's frame and title take their share: grow it by what the view is short of
        short_w, short_h = size[0] - view.width(), size[1] - view.height()
        if not short_w and not short_h:
            break
        dock.resize(dock.width() + short_w, dock.height() + short_h)
        QCoreApplication.processEvents()


def export_animation(window, events: list, out_path: str | Path, *, view: str | None = None, fps: float | None = None,
                     speed: float = 1.0, hover: bool = True, max_frames: int = MAX_FRAMES,
                     size: tuple[int, int] | None = None,
                     plan_told: Callable[[AnimationPlan], None] | None = None,
                     progress: Callable[[int, int], None] | None = None,
                     should_stop: Callable[[], bool] | None = None) -> AnimationResult | None:
    """Replay ``events`` (a saved run) in ``window`` and write the frames to ``out_path`` (its format from the
    suffix). ``plan_told`` hears the plan before the first frame; ``progress(done, total)`` after each frame;
    ``should_stop`` ends it early (None returned, nothing written)."""
    from PySide6.QtCore import QCoreApplication

    from playground.ui.replay import Replay

    out = Path(out_path)
    check_output(out)
    if view is not None and view not in window.views:
        raise ScreenshotError(f"no view named {view!r} (views: {', '.join(window.views)})")
    started = time.perf_counter()
    replay = Replay(window.run_views, events, source=out.name, settle_in=window, on_shown=window.status.show_run)
    if len(replay) > max_frames:
        raise ScreenshotError(f"the run makes {len(replay)} frames, over the budget of {max_frames}: raise "
                              "--max-frames, or export a shorter run")
    delays = frame_delays([f.recorded_ms for f in replay.frames], fps, speed)
    replay.show(0)
    if view is None:
        widget = window
    else:
        widget = window.views[view]
        _float_view(window.docks[view], widget, size)
    QCoreApplication.processEvents()
    widget.setFixedSize(widget.size())  # every frame as big as the first, however the views' contents grow
    plan = AnimationPlan(len(replay), widget.width(), widget.height(), sum(delays) / 1000.0, view)
    if plan_told is not None:
        plan_told(plan)
    stopped = False

    def grab(k: int):
        replay.show(k)
        pixmap = widget.grab()
        if hover:
            for shown in window.shown_views():
                if widget is window or shown is widget:
                    shown.paint_overlay(pixmap, widget)
        return to_pillow(pixmap)

    def frames() -> Iterator:
        nonlocal stopped
        encode = None
        if out.suffix.lower() == ".gif":
            encode = GifFrames(gif_palette([grab(k) for k in sorted({0, len(replay) // 2, len(replay) - 1})]))
        for k in range(len(replay)):
            if should_stop is not None and should_stop():
                stopped = True
                return
            rgb = grab(k)
            yield encode(rgb) if encode is not None else rgb
            if progress is not None:
                progress(k + 1, len(replay))

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".part")
    try:
        _encode_to(partial, out.suffix.lower(), frames(), delays)
        if stopped:
            partial.unlink(missing_ok=True)
            return None
        partial.replace(out)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return AnimationResult(out, len(replay), out.stat().st_size, time.perf_counter() - started)


def _encode_to(path: Path, suffix: str, frames: Iterator, delays: list[int]) -> None:
    """The frames into ``path`` as ``suffix`` says, whatever the path's own name (a partial file first, renamed
    when whole)."""
    fmt = {".gif": "GIF", ".webp": "WEBP"}.get(suffix)
    if fmt is None:
        _encode_mp4(path, frames, delays)
        return
    first = next(frames)
    options = dict(save_all=True, append_images=frames, duration=delays, loop=0)
    if fmt == "GIF":
        options.update(optimize=False, disposal=1, transparency=TRANSPARENT)
    else:
        options.update(lossless=True, quality=0, method=0)
    first.save(path, format=fmt, **options)
