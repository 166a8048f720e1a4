"""The watermark lab's views: the live record of a watermarked run (``watermark``). Registers on import."""

from playground.ui.views.watermark.view import WatermarkView

__all__ = ["WatermarkView"]
