"""Decoding Playground: watch, steer and compare how a language model decodes.

Importing the package loads neither torch nor Qt.
"""

__version__ = "0.1.0"
