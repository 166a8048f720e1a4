"""The tokens view, one module per part: ``view`` (the view interface, the CSV export, the hover drawn into a
picture), ``text`` (the shaded output, its legend and caption), ``candidates`` (the bar chart of one step) and
``tooltip`` (a token's numbers in words). Importing the package registers the view."""

from playground.ui.views.tokens.view import TokensView

__all__ = ["TokensView"]
