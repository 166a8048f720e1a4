"""Why this token, by the prompt: prompt salience (``salience``) and activation patching (``patching``). Both
register on import."""

from playground.ui.views.attribution_maps.patching import PatchingView
from playground.ui.views.attribution_maps.salience import SalienceView

__all__ = ["PatchingView", "SalienceView"]
