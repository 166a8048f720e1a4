"""Contrastive search (Su et al. 2022), as transformers' ``generate(penalty_alpha=α, top_k=k)``: each step weighs
the model's k likeliest tokens by (1 − α)·p(x) − α·(the largest cosine similarity of x's last hidden state to the
context's), the degeneration penalty.

Its k is the shared ``--top-k`` (``RunSettings.top_k``), as in transformers, where ``top_k`` is both the sampler's
and contrastive search's: the top-k sampler is a sampling setting this strategy does not read, so the one flag means
one thing per run. The catalog entry says so (``reads``) and the form enables that one field for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from playground.config.catalog import Strategy, register_strategy
from playground.config.groups import SettingsGroup, register_group
from playground.config.table import setting
from playground.events import TokenStep
from playground.events.contrastive_search import SearchStep

NAME = "contrastive-search"


@register_group
@dataclass(frozen=True)
class ContrastiveSearchSettings(SettingsGroup):
    name = "contrastive_search"
    title = "Contrastive search"
    order = 95  # its box comes after the built-ins before it, last in the form

    penalty_alpha: float = setting(
        0.6, "penalty α", "contrastive search: score = (1 − α)·p(token) − α·degeneration penalty (the largest cosine "
        "similarity of the token's last hidden state to any earlier token's, prompt included); 0 = greedy; the "
        "candidates are the --top-k K likeliest tokens (--top-k is its k, as transformers' top_k)",
        minimum=0.0, maximum=1.0, step=0.05)

    def summary(self) -> str:
        return f"α={self.penalty_alpha:g}"


def search_checks(settings: Any) -> list[tuple[bool, str]]:
    """The rules over the shared settings it reads: k (``--top-k``) must be at least 1."""
    return [(settings.top_k >= 1,
             f"contrastive search takes its k from --top-k: set --top-k K ≥ 1, the candidates weighed each step "
             f"(4 to 10 are usual; got {settings.top_k})")]


register_strategy(Strategy(
    NAME, "contrastive search (Su et al. 2022): of the --top-k K likeliest tokens, the best (1 − α)·p − α·max "
    "cosine similarity of its last hidden state to the context's (--penalty-alpha α; not contrastive decoding, "
    "which is 'contrastive')", sections=("penalties",), groups=(ContrastiveSearchSettings,), reads=("top_k",),
    checks=search_checks, step_events=(SearchStep, TokenStep),
    runner="playground.engine.contrastive_search.decode:run_contrastive_search", order=95))
