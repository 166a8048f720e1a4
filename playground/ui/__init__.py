"""PySide6 + pyqtgraph views of the decoding engine. Imported lazily by the CLI (headless commands need no Qt)."""
