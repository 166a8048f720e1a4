"""The attention view, one module per panel (see ``view``); importing the package registers the view."""

from playground.ui.views.attention.view import AttentionView

__all__ = ["AttentionView"]
