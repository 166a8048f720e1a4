"""The "why this token" view: uncertainty and commitment strips over the output, and logit attribution by layer
and head."""

from playground.ui.views.dla.view import DlaView

__all__ = ["DlaView"]
