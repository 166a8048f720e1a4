"""Rolling a KV cache back past rejected drafts, also across a sliding window."""

from __future__ import annotations

from transformers import DynamicCache


def keep_past(cache: object) -> None:
    """Make ``cache`` able to roll back: a sliding-window layer past its window otherwise drops the positions a
    rejected draft would need back (transformers raises on ``crop`` then). Recording keeps them until the next
    ``roll_back``, which trims the layer to its window again. Call it before the first pass that may be rolled back."""
    record = getattr(cache, "activate_past_recording", None)
    if record is not None:
        record()


def roll_back(cache: DynamicCache, keep: int) -> None:
    """Drop every cached position from ``keep`` on (the drafts that were rejected); sliding-window layers are
    trimmed back to their window (``crop(0)`` does only that)."""
    extra = cache.get_seq_length() - keep
    cache.crop(-extra if extra > 0 else 0)
