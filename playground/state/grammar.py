"""What a constraint (``--json-schema``, ``--regex``, ``--grammar``, ``--choices``) did over a run, for the tokens
view: which shown candidates it forbade, how each step reads (forced, overrode the model's top token, free), and
what it cost in all (``TokenStep.grammar``, one ``GrammarStep`` per step).

The cost: at a step where the mask removed raw probability ``m``, every allowed token's probability is divided by
``1 − m`` when the distribution is renormalised over what is left, so its log-probability rises by ``−ln(1 − m)``
nats. The run's total, ``Σ −ln(1 − m)`` over its steps, is the log-probability the constraint cost:
``exp(−total)`` is the chance that the raw model, drawing at each step of this output, would have kept to the
constraint by itself at every one of them. Where the step recorded the allowed tokens' raw mass on its own
(``GrammarStep.allowed_mass``) the cost is ``−ln`` of it, the same number kept to full precision where ``1 − m``
rounds away (a forced token the model gave 1e-9). A step whose allowed tokens hold no raw probability at all costs
without bound; those are counted apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from playground.config import RunSettings
from playground.config.samplers.grammar import GrammarSettings
from playground.events import TokenStep
from playground.events.grammar import GrammarStep

# The reason a candidate is struck through: "forbidden by the schema".
CONSTRAINT_WORDS = {"json_schema": "the schema", "regex": "the regex", "grammar": "the grammar",
                    "choices": "the choices"}
GRAMMAR_SAMPLER = "grammar"  # the constraint's name in a step's processor effects (``cut_by``)


def constraint_kind(settings: RunSettings | None) -> str | None:
    """"json_schema", "regex", "grammar" or "choices": the run's constraint, None without one."""
    if settings is None:
        return None
    given = settings.group(GrammarSettings).given()
    return given[0] if given else None


def forbidden_reason(kind: str | None) -> str:
    """"forbidden by the schema" (``kind`` None: "forbidden by the constraint")."""
    return f"forbidden by {CONSTRAINT_WORDS.get(kind or '', 'the constraint')}"


def forbidden_ids(step: TokenStep) -> frozenset[int]:
    """The step's shown candidates the constraint's mask forbade.

    From ``GrammarStep.forbidden`` (the raw top candidates the mask forbids); a run saved before that field names
    the candidates whose first cut was the constraint's (``cut_by``: one cut earlier in the chain, a logit bias of
    −∞, would hide that the mask forbade it too)."""
    record = step.grammar
    if record is None:
        return frozenset()
    if record.forbidden is not None:
        return frozenset(record.forbidden)
    return frozenset(c.token_id for c in step.candidates if c.cut_by == GRAMMAR_SAMPLER)


def renormalisation_cost(record: GrammarStep) -> float:
    """``−ln(1 − m)`` nats, ``m`` the raw mass removed: what renormalising over the allowed tokens adds to each
    one's log-probability (``inf`` when nothing is left). Taken as ``−ln`` of the allowed tokens' own raw mass
    where the step recorded it (``1 − m`` has no digits left when the allowed tokens hold 1e-9), else from ``m``."""
    if record.allowed_mass is not None:
        return -math.log(record.allowed_mass) if record.allowed_mass > 0 else math.inf
    if record.removed_mass >= 1.0:
        return math.inf
    return -math.log1p(-max(0.0, record.removed_mass))


@dataclass(frozen=True)
class ConstraintSummary:
    """A run's constrained steps in figures."""

    steps: int  # steps with a constraint record
    overrode: tuple[int, ...]  # steps whose raw top token the constraint forbade
    forced: tuple[int, ...]  # steps where it allowed one token only
    cost: float  # Σ −ln(1 − removed mass) over the steps with some raw probability left, nats
    unbounded: tuple[int, ...]  # steps whose allowed tokens hold no raw probability (their cost has no bound)

    @property
    def kept_probability(self) -> float:
        """``exp(−cost)``: the chance the raw model keeps to the constraint at every step of this output."""
        return 0.0 if self.unbounded else math.exp(-self.cost)


def step_kinds(step: TokenStep) -> tuple[str, ...]:
    """How a constrained step reads, for the strip's rows: "forced" (one token allowed), "overrode" (the raw top
    token forbidden; a step may be both), else "free"; () without a record."""
    record = step.grammar
    if record is None:
        return ()
    kinds = tuple(k for k, on in (("forced", record.forced), ("overrode", record.top_forbidden)) if on)
    return kinds or ("free",)


def summarise(steps: Sequence[TokenStep]) -> ConstraintSummary | None:
    """The run's constraint in figures; None when no step has a record (no constraint, or a server's run)."""
    records = [(s.step, s.grammar) for s in steps if s.grammar is not None]
    if not records:
        return None
    costs = [(i, renormalisation_cost(r)) for i, r in records]
    return ConstraintSummary(
        steps=len(records),
        overrode=tuple(i for i, r in records if r.top_forbidden),
        forced=tuple(i for i, r in records if r.forced),
        cost=math.fsum(c for _, c in costs if math.isfinite(c)),
        unbounded=tuple(i for i, c in costs if not math.isfinite(c)))


def unconstrained_settings(parent: RunSettings, forced: tuple[int, ...]) -> RunSettings:
    """The parent run's settings without its constraint, forcing ``forced`` (its tokens before the branch step):
    what the model would have said from there on its own."""
    groups = tuple(g for g in parent.groups if not isinstance(g, GrammarSettings))
    return parent.replace(groups=groups, forced_token_ids=forced,
                          max_new_tokens=max(parent.max_new_tokens, len(forced) + 1))
