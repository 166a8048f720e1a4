"""The speculative view, one module per panel: ``view`` (the view: its layout, the selected round, the export),
``text`` (the marked output), ``rounds`` (the timeline), ``round_chart`` (the selected round, with ``tree`` for a
tree's round and the what-if grid), ``positions``, ``what_if``, ``figures`` (header and figures) and ``export``
(the CSV). Importing the package registers the view."""

from playground.ui.views.speculative.view import SpeculativeView

__all__ = ["SpeculativeView"]
