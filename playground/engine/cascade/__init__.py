"""Cascade inference: a cheap model answers first; the full model takes over where the cheap one is unsure
(per token, or for the whole response)."""
