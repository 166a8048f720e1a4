"""Activation steering's views: what a steering vector does to each token (``steering``) and the strength sweep
side by side (``steering-sweep``). Both register on import."""

from playground.ui.views.steering.sweep import SteeringSweepView
from playground.ui.views.steering.view import SteeringView

__all__ = ["SteeringSweepView", "SteeringView"]
