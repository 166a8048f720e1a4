"""Speculative decoding: a drafter proposes, the target verifies (see ``decode``, ``drafters``, ``verify``)."""
