"""The contrastive-search view: ``view`` (the layout, the shown step, the hovered candidate), ``strip`` (every step,
where the penalty overturned the model's top choice) and ``text`` (the sequence, the hovered candidate's most similar
earlier token marked). Importing the package registers the view."""

from playground.ui.views.contrastive_search.view import ContrastiveSearchView

__all__ = ["ContrastiveSearchView"]
