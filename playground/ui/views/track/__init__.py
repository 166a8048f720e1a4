"""The track view: one token's raw and processed probability and its rank at every step of a run."""

from playground.ui.views.track.view import TrackView

__all__ = ["TrackView"]
