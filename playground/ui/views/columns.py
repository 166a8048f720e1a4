"""Responsive columns: a view lays its panels out for a tall dock or a short one (1280 x 800's), switching when its
height crosses ``SHORT_DOCK``; and the small base of a view's panels (napari's controls: each part of a view a small
object that builds its widgets once and draws them in place)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # the mixin goes before a view's Qt base: to the checker it is that widget
    from PySide6.QtWidgets import QWidget as _ViewBase
else:
    _ViewBase = object

SHORT_DOCK = 600  # px: a view lower than this is a short dock (1280 x 800's is 531)


class ShortDock(_ViewBase):
    """Mixin for a view (before its Qt base): ``short`` follows the view's height, ``_arrange(short)`` is called
    when it changes (the view moves its panels; it is not called for the tall layout it was built with)."""

    short: bool = False

    def resizeEvent(self, event) -> None:  # Qt's name
        short = event.size().height() < SHORT_DOCK
        if short != self.short:
            self.short = short
            self._arrange(short)
        super().resizeEvent(event)

    def _arrange(self, short: bool) -> None:
        raise NotImplementedError


class Panel:
    """One part of a view: built once (its widgets and plot items), drawn in place by ``draw()`` whenever one of
    the fold's parts it shows (``shows``) changed."""

    shows: ClassVar[frozenset[str]] = frozenset()

    def draw(self) -> None:
        raise NotImplementedError
