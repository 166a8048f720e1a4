"""Prompt salience at the end of a run: which context tokens made step N's token likely.

``--salience occlusion,grad_x_input,integrated_gradients`` computes, once the run has decoded, the salience of
the token chosen at step ``--salience-step`` (0 = the first generated token; −1 = the last) by each method, and
their agreement (Spearman's ρ). The window also computes it on demand for any step of a shown run (the salience
view's "Explain step"); either way the maps are kept with the run. The methods:
``playground.engine.attribution.salience``.
"""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.catalog import SharedGroup, register_shared_group
from playground.config.groups import SettingsGroup, register_group
from playground.config.table import setting
from playground.events.salience import SALIENCE_METHODS

IG_RULES = ("gausslegendre", "riemann_trapezoid")


def parse_methods(text: str) -> tuple[str, ...]:
    """``"occlusion, ig"`` -> the methods, in order; "all" -> every one; ValueError naming an unknown one."""
    aliases = {"ig": "integrated_gradients", "gxi": "grad_x_input", "gradxinput": "grad_x_input"}
    found: list[str] = []
    for part in text.replace(",", " ").split():
        name = aliases.get(part.lower(), part.lower().replace("-", "_"))
        if name == "all":
            return SALIENCE_METHODS
        if name not in SALIENCE_METHODS:
            raise ValueError(f"{part!r} is not a salience method (methods: {', '.join(SALIENCE_METHODS)}, all)")
        if name not in found:
            found.append(name)
    return tuple(found)


@register_group
@dataclass(frozen=True)
class SalienceSettings(SettingsGroup):
    name = "salience"
    title = "Prompt salience"
    order = 110

    salience: str = setting(
        "", "salience methods", "after the run, explain one step's token by the context tokens: occlusion, "
        "grad_x_input, integrated_gradients (ig), or all, commas between; empty = none (the salience view can "
        "still explain any step on demand)")
    salience_step: int = setting(0, "salience step", "the step whose token is explained (0 = the first "
                                 "generated token, -1 = the last)", minimum=-1)
    ig_steps: int = setting(32, "IG steps", "integrated gradients' points on the path from the baseline",
                            minimum=2, maximum=512)
    ig_rule: str = setting("gausslegendre", "IG rule", "integrated gradients' quadrature (Captum's names)",
                           choices=IG_RULES)
    occlude: str = setting("token", "occlude", "what occlusion hides at a time: one token, or a word (all its "
                           "tokens; a word starts at a space or a punctuation mark)", choices=("token", "word"))

    def active(self) -> bool:
        return bool(self.salience.strip())

    def methods(self) -> tuple[str, ...]:
        return parse_methods(self.salience)

    def summary(self) -> str:
        if not self.active():
            return "no salience"
        try:
            return f"salience of step {self.salience_step}: " + ", ".join(self.methods())
        except ValueError:
            return "salience (invalid)"

    def cross_checks(self) -> list[tuple[bool, str]]:
        try:
            self.methods()
        except ValueError as error:
            return [(False, f"--salience: {error}")]
        return []


register_shared_group(SharedGroup(
    SalienceSettings, "--salience explains a step's token by the prompt after the run",
    "does not decode one sequence token by token", takers=("greedy", "sample"),
    wrapper="playground.engine.attribution.salience_run:run_with_salience", keeps_chooser=True, order=80))
