"""The beam tree view, one module per part: ``view`` (the view interface), ``panel`` (the tree, its header, the
length-penalty re-ranking and the KV line) and ``items`` (the drawing pieces: chunks of nodes and edges, labels, hover,
the fill ramp). Importing the package registers the view."""

from playground.ui.views.beam_tree.view import BeamTreeView

__all__ = ["BeamTreeView"]
