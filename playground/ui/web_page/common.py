"""What the page's sections share: compact numbers, and token texts shaded as the app shades them."""

from __future__ import annotations

from typing import Any

from playground.state.text import flowing_token_text
from playground.ui.style import shade_for_prob, text_color_on


def compact(value: float, digits: int = 5) -> float:
    """A number with ``digits`` significant digits: the page's JSON stays small."""
    return float(f"{value:.{digits}g}")


def shaded(text: str, prob: float) -> list[Any]:
    """A token as the page draws it: [text, probability, background, text colour], the shade the app's."""
    shade = shade_for_prob(prob)
    return [flowing_token_text(text) if text else "·", compact(prob), shade.name(), text_color_on(shade).name()]
