"""What a strategy cannot run without, for tests that run every strategy: contrastive search's k is --top-k, whose
default 0 is the top-k sampler's "off" (the strategy refuses it with a message)."""

NEEDS: dict[str, dict[str, object]] = {"contrastive-search": {"top_k": 4},
                                       "patching": {"corrupted": "Jello"}}  # as many tokens as "Hello"
