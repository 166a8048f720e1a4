"""Kept for the modules that still import the shared marked text from here (``views/cascade.py``,
``views/side_by_side.py``, ``tests/test_view_edges.py``): it lives in ``playground.ui.marked_text``, and the tokens
view's own parts in ``playground.ui.views.tokens``. Delete this module once those imports name ``marked_text``."""

from playground.ui.marked_text import SPLIT_LINES, MarkedTextEdit, split_wrapped_paragraph

__all__ = ["SPLIT_LINES", "MarkedTextEdit", "split_wrapped_paragraph"]
