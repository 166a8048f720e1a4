"""The speculative view, one module per part: ``view`` (the view: figures, plots, the what-if curve) and ``text``
(the marked output: accepted, rejected and target tokens). Importing the package registers the view."""

from playground.ui.views.speculative.view import SpeculativeView

__all__ = ["SpeculativeView"]
