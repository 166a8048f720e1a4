"""Direct logit attribution settings: which steps of a run to explain after it ends, and against which token.

``--attribute-steps 0,3-5`` (or ``all``) and ``--attribute-word " Paris"`` (the first step that emits it) pick the
steps; ``--attribute-against " Lyon"`` names the alternative B (one token; empty: each step's runner-up). After the
strategy's last token the engine's wrapper ``playground.engine.dla.run:run_attributed`` reads the prompt and the
tokens once more, in one forward pass for every step asked, and yields a ``LogitAttribution`` per step before the
run's end; saved runs keep them.
"""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.catalog import SharedGroup, register_shared_group
from playground.config.groups import SettingsGroup, register_group
from playground.config.table import setting


def parse_steps(text: str) -> tuple[int, ...] | None:
    """``"0,3-5"`` -> (0, 3, 4, 5); ``"all"`` -> None (every step); ``""`` -> (). ValueError with the reason."""
    text = text.replace(" ", "")
    if text.lower() == "all":
        return None
    steps: set[int] = set()
    for part in filter(None, text.split(",")):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{part!r} is not a step or a range such as 3-5 (steps count from 0)")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"{part!r}: a range goes upwards (START-END, both included)")
        steps.update(range(low, high + 1))
    return tuple(sorted(steps))


@register_group
@dataclass(frozen=True)
class AttributionSettings(SettingsGroup):
    name = "dla"
    title = "Logit attribution"
    order = 99  # its box after the built-ins

    def active(self) -> bool:
        return bool(self.attribute_steps or self.attribute_word)

    attribute_steps: str = setting(
        "", "attribute steps", "STEPS: after the run, split each of these steps' logit difference (its token over "
        "the runner-up, or --attribute-against) into the embeddings, each layer's attention (and head) and MLP: "
        "'0,3-5' (steps count from 0) or 'all'; one extra forward pass for all of them")
    attribute_word: str = setting(
        "", "attribute word", "WORD: also attribute the first step whose token is this word (e.g. ' Paris'; "
        "compared with and without its leading space)")
    attribute_against: str = setting(
        "", "attribute against", "WORD: the alternative the attributed tokens are compared with (one token of the "
        "model's vocabulary); empty = each step's runner-up")

    def steps(self) -> tuple[int, ...] | None:
        return parse_steps(self.attribute_steps)

    def summary(self) -> str:
        if not self.active():
            return "no attribution"
        what = [f"steps {self.attribute_steps}"] if self.attribute_steps else []
        what += [f"word {self.attribute_word!r}"] if self.attribute_word else []
        against = f" vs {self.attribute_against!r}" if self.attribute_against else ""
        return "attribute " + ", ".join(what) + against

    def cross_checks(self) -> list[tuple[bool, str]]:
        try:
            self.steps()
        except ValueError as error:
            return [(False, f"--attribute-steps: {error}")]
        return [(bool(self.attribute_steps or self.attribute_word) or not self.attribute_against,
                 "--attribute-against needs steps to attribute: add --attribute-steps or --attribute-word")]


# Attribution reads the run's own sequence once more (greedy and sampling: prompt + tokens is one sequence); inside
# --steer's wrapper, so a steering vector is on during its pass and shows as its own component.
register_shared_group(SharedGroup(
    AttributionSettings, "--attribute-steps explains a run's tokens by logit attribution",
    "does not decode one sequence of tokens", takers=("greedy", "sample"),
    wrapper="playground.engine.dla.run:run_attributed", keeps_chooser=True, order=40))
