"""Runs and views to files: opening a saved run (``trace`` output) without any model, saving the selected run,
exporting a view (a picture, or its data where the view has some), each with its dialog."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QStatusBar, QWidget

from playground.config import ConfigError
from playground.state import Run, Session
from playground.ui.banner import MessageBanner
from playground.ui.views.base import ExportError, View


class SavedRuns:
    """Files in and out of ``session``; ``show_run`` lists an opened run and shows it in the views."""

    def __init__(self, parent: QWidget, session: Session, views: Mapping[str, View], banner: MessageBanner,
                 status: QStatusBar, show_run: Callable[[Run], None]) -> None:
        self.parent, self.session, self.views = parent, session, views
        self.banner, self.status, self.show_run = banner, status, show_run

    def open(self, path: str | Path) -> Run | None:
        """Show a saved run (``trace`` output) in every view that applies, without any model."""
        from playground.traces import TraceError, read_trace

        try:
            trace = read_trace(path)
        except TraceError as error:
            self.banner.show_error(f"Could not open the run: {error}")
            return None
        run = self.session.add_saved_run(trace.events, Path(path).name)
        self.show_run(run)
        problems = trace.problems()
        if problems:
            self.banner.show_info(f"Opened {Path(path).name}, not all of it: {problems}.")
        else:
            self.banner.hide()
            self.status.showMessage(f"Opened {path}", 10000)
        return run

    def save(self, path: str | Path) -> Path:
        """The selected run to ``path`` (``ConfigError`` when there is none yet)."""
        from playground.traces import write_trace

        run = self.session.selected
        if run is None:
            raise ConfigError("there is no run to save yet")
        return write_trace(run.events, path)

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.parent, "Open a saved run", "",
                                              "Runs (*.jsonl *.json);;All files (*)")
        if path:
            self.open(path)

    def save_dialog(self) -> None:
        if self.session.selected is None:
            self.banner.show_info("There is no run to save yet.")
            return
        path, _ = QFileDialog.getSaveFileName(self.parent, "Save the run", "run.jsonl", "Runs (*.jsonl)")
        if path:
            try:
                self.status.showMessage(f"Saved {self.save(path)}", 10000)
            except OSError as error:
                self.banner.show_error(f"Could not save the run: {error}")

    def export_dialog(self, view: View) -> None:
        filters = ";;".join([f"{fmt.upper()} (*.{fmt})" for fmt in ("png", "svg", *view.data_formats)])
        path, _ = QFileDialog.getSaveFileName(self.parent, f"Export the {view.title.lower()}", f"{view.name}.png",
                                              filters)
        if path:
            self.export(view.name, path)

    def export_page_dialog(self) -> None:
        if self.session.selected is None:
            self.banner.show_info("There is no run to export yet.")
            return
        path, _ = QFileDialog.getSaveFileName(self.parent, "Export the run as a web page", "run.html",
                                              "Web page (*.html)")
        if path:
            self.export_page(path)

    def export_page(self, path: str | Path) -> Path | None:
        """The selected run as one self-contained web page; None (and why, in the banner) when it cannot be."""
        from playground.errors import ScreenshotError
        from playground.ui.web_page import write_page

        run = self.session.selected
        if run is None:
            self.banner.show_info("There is no run to export yet.")
            return None
        try:
            out = write_page(list(run.events), path)
        except (ScreenshotError, OSError) as error:
            self.banner.show_error(f"Could not export the web page: {error}")
            return None
        self.status.showMessage(f"Exported {out} ({out.stat().st_size / 1024:.0f} KB)", 10000)
        return out

    def export(self, name: str, path: str | Path) -> Path | None:
        """View ``name`` to ``path`` (its format from the suffix); None (and the reason in the banner) on failure."""
        try:
            out = self.views[name].export(path)
        except (ExportError, OSError) as error:
            self.banner.show_error(f"Could not export: {error}")
            return None
        self.status.showMessage(f"Exported {out}", 10000)
        return out
