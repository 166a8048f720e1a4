"""The contrastive view, one module per panel: ``view`` (the view: its layout, the shown step, the export),
``chart`` (the shown step's three panels and its numbers), ``strip`` (every step), ``dola`` (DoLa's layers),
``what_if`` (the what-if α), ``figures`` (header and figures), ``export`` (the CSV) and ``style`` (what they share).
Importing the package registers the view."""

from playground.ui.views.contrastive.style import CHANGED_COLOR, FLOOR, SAME_COLOR
from playground.ui.views.contrastive.view import ContrastiveView

__all__ = ["CHANGED_COLOR", "FLOOR", "SAME_COLOR", "ContrastiveView"]
