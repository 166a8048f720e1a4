"""Decoding strategies in pure PyTorch: each one is a generator of `playground.events` events.

This package never imports Qt (a test enforces it).
"""
