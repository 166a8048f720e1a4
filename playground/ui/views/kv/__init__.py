"""The KV-cache view, one module per panel (see ``view``); importing the package registers the view."""

from playground.ui.views.kv.panel import FREE_COLOR, MB, SHARED_COLOR, TOTAL_COLOR, format_mb
from playground.ui.views.kv.view import KVView

__all__ = ["FREE_COLOR", "MB", "SHARED_COLOR", "TOTAL_COLOR", "KVView", "format_mb"]
