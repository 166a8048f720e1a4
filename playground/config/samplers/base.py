"""A sampler's declaration: everything about it that needs no torch, in one record (``SamplerSpec``).

Each module of ``playground.config.samplers`` declares its samplers with ``register_sampler``; the package imports
every module (no hand-kept list), so a new sampler is a new file there (with its engine object in
``playground.engine.samplers`` and its what-if stage in ``playground.state.what_if.stages``, under the same stem).
The chain's order, the CLI's ``--samplers`` words, the form's chain list, the engine's flags (sampling-only,
value-only, truncating, needs the run's state), the server's words and the what-if's bound all read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from playground.config.groups import SettingsGroup


@dataclass(frozen=True)
class ServerWords:
    """How a server takes the sampler: its word in llama-server's ``samplers`` list and its request fields there,
    or why a server cannot take it (the refusal names the sampler)."""

    llama_word: str | None = None  # its name in llama-server's sampler chain (None: not a chain entry there)
    llama: Callable[[Any, bool], dict[str, Any]] | None = None  # (settings, sampling) -> llama-server's body fields
    nowhere: str = ""  # why no server takes it ("" when some do)
    llama_only: str = ""  # its label where only llama-server has it ("" when every server takes it, or none)
    # Other OpenAI-compatible servers (vLLM, generic): (settings, engine, sampling) -> their extra fields for it, or
    # the whole refusal when that engine lacks it; and OpenAI's own request fields, which every such server takes.
    other: Callable[[Any, str, bool], dict[str, Any] | str] | None = None
    openai: Callable[[Any], dict[str, Any]] | None = None


@dataclass(frozen=True)
class SamplerSpec:
    """One sampler, declared once. ``position``: its place in the default order (transformers' processors in
    ``generate()``'s order, then the ones it lacks); ``is_on(settings)``: whether a ``RunSettings`` switches it
    on; ``reads``: the settings fields it reads (flat ``RunSettings`` fields; a new sampler's live in its own
    ``group``)."""

    name: str
    help: str
    position: int
    is_on: Callable[[Any], bool]
    reads: tuple[str, ...] = ()
    group: type[SettingsGroup] | None = None  # a new sampler's own settings (CLI flags, form, saved runs)
    aliases: tuple[str, ...] = ()  # other words for it in --samplers
    sampling_only: bool = True  # shapes the distribution a token is drawn from: greedy (beam, ...) skip it
    value_only: bool = False  # reads only the logits' values (no token ids, no count of removed tokens)
    truncating: bool = False  # may remove tokens (the chain may go compact after it)
    needs_run: str = ""  # why it needs a strategy that carries the run's state ("" when it does not)
    selecting: bool = False  # draws the token itself (llama.cpp forces it last in the chain)
    stages: tuple[str, ...] = ()  # other names its engine stage goes by ("dynatemp" for temperature with a range)
    server: ServerWords = field(default_factory=ServerWords)
    what_if: str = "exact"  # the what-if's bound: "exact" (or "exact when ..."), or "estimate: why" (never exact)
    # Settings that switch it on with a value that does something (``RunSettings.from_flat`` names; a cut may join
    # to take out the unrecorded tokens): tests/test_what_if_vs_engine.py re-derives a run with each and holds the
    # what-if to the engine wherever it says exact. Every sampler declares at least one.
    what_if_examples: tuple[dict[str, Any], ...] = ()

    @property
    def stage_names(self) -> tuple[str, ...]:
        return (self.name, *self.stages)


# The what-if bound of the samplers that read the whole distribution (typical-p, eta, top-nσ).
WHOLE_DISTRIBUTION = ("exact where it sees the raw distribution (first in the chain: each step records the whole "
                      "vocabulary's entropy and logit spread) or once the tokens outside the recorded candidates are "
                      "cut, when its cut is decided within the recorded ones; else an estimate (it reads the whole "
                      "distribution)")

SPECS: dict[str, SamplerSpec] = {}  # by name, in the default order
SAMPLER_GROUPS: dict[type[SettingsGroup], SamplerSpec] = {}  # a sampler's own settings group -> the sampler
SAMPLERS: dict[str, str] = {}  # name -> what it is, in the default order (kept in step with SPECS)
ALIASES: dict[str, str] = {}  # another word for a sampler -> its name


def _refresh() -> None:
    ordered = sorted(SPECS.values(), key=lambda s: s.position)  # stable: equal positions keep their turn
    SPECS.clear()
    SPECS.update((s.name, s) for s in ordered)
    SAMPLERS.clear()
    SAMPLERS.update((s.name, s.help) for s in ordered)
    ALIASES.clear()
    ALIASES.update((alias, s.name) for s in ordered for alias in s.aliases)


def register_sampler(spec: SamplerSpec) -> SamplerSpec:
    """Make a sampler known to the chain, the CLI, the form, the engine, the server request and the what-if."""
    taken = {word for other in SPECS.values() if other.name != spec.name
             for word in (other.name, *other.aliases, *other.stages)}
    clash = taken & {spec.name, *spec.aliases, *spec.stages}
    if clash:
        raise ValueError(f"sampler {spec.name!r} reuses the names {sorted(clash)}")
    SPECS[spec.name] = spec
    _refresh()
    if spec.group is not None:
        SAMPLER_GROUPS[spec.group] = spec
    return spec


def unregister_sampler(name: str) -> None:
    """Forget a sampler (for tests that declare one in a temporary module)."""
    spec = SPECS.pop(name)
    _refresh()
    if spec.group is not None:
        SAMPLER_GROUPS.pop(spec.group, None)


def spec_of_stage(stage: str) -> SamplerSpec | None:
    """The sampler whose engine stage has this name ("dynatemp" -> temperature)."""
    for spec in SPECS.values():
        if stage in spec.stage_names:
            return spec
    return None


def unescape_breaker(text: str) -> str:
    r"""A sequence breaker as typed (``\n`` for a newline, as the stop strings take it)."""
    return text.replace("\\n", "\n").replace("\\t", "\t")
