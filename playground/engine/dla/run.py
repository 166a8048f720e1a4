"""The attribution wrapper: the strategy runs as usual; after its last token, the steps asked for are attributed
in one forward pass over the prompt and the tokens (``attribute``), and their events come before the run's end."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from playground.config import RunSettings
from playground.config.dla import AttributionSettings
from playground.config.errors import ConfigError
from playground.engine.dla.attribute import Request, attribute
from playground.engine.run_context import RunContext
from playground.engine.strategies import Runner, call_runner
from playground.engine.token_text import TokenTextCache
from playground.events import Event, Rollback, RunFinished, RunStarted, TokenStep
from playground.events.dla import AttributionMissing, LogitAttribution
from playground.models.loaded import LoadedModel


def single_token(lm: LoadedModel, word: str, what: str) -> int:
    """The one token id of ``word``; ConfigError when the tokenizer splits it."""
    ids = lm.tokenizer.encode(word, add_special_tokens=False)
    if len(ids) != 1:
        pieces = [lm.tokenizer.decode([i]) for i in ids]
        raise ConfigError(f"{what} {word!r} is {len(ids)} tokens for this model ({pieces}): give a single token, "
                          "e.g. with its leading space (' Lyon')")
    return int(ids[0])


def run_attributed(runner: Runner, lm: LoadedModel, settings: RunSettings, context: RunContext | None = None
                   ) -> Iterator[Event]:
    dla = settings.group(AttributionSettings)
    against = single_token(lm, dla.attribute_against, "--attribute-against") if dla.attribute_against else None
    events = call_runner(runner, lm, settings, RunContext.of(context))
    return _attributed(events, lm, dla, against)


def _attributed(events: Iterator[Event], lm: LoadedModel, dla: AttributionSettings, against: int | None
                ) -> Iterator[Event]:
    prompt: tuple[int, ...] = ()
    steps: list[TokenStep] = []
    for event in events:
        if isinstance(event, RunStarted):
            prompt = event.prompt_token_ids
        elif isinstance(event, TokenStep):
            steps.append(event)
        elif isinstance(event, Rollback):  # a phrase ban took these steps back
            del steps[event.position:]
        elif isinstance(event, RunFinished) and event.stop_reason != "stopped":
            try:
                yield from attribute_run(lm, prompt, steps, dla.steps(), dla.attribute_word, against)
            except ConfigError as error:  # e.g. a quantized copy's head holds no float weight: the run still ends
                yield AttributionMissing(what=f"no attribution: {error}")
        yield event


def wanted_steps(steps: Sequence[TokenStep], asked: tuple[int, ...] | None, word: str) -> tuple[list[int], list[str]]:
    """The steps to attribute (of those the run has) and what could not be found, in words."""
    count = len(steps)
    chosen = set(range(count)) if asked is None else {s for s in asked if s < count}
    missing = [f"step {s} (the run has {count} steps)" for s in (asked or ()) if s >= count]
    if word:
        found = [s.step for s in steps if s.text == word or s.text.strip() == word.strip()]
        if found:
            chosen.add(found[0])
        else:
            missing.append(f"the word {word!r} (not emitted in this run)")
    return sorted(chosen), missing


def attribute_run(lm: LoadedModel, prompt: Sequence[int], steps: Sequence[TokenStep], asked: tuple[int, ...] | None,
                  word: str = "", against: int | None = None) -> Iterator[Event]:
    """The run's steps asked for, attributed (one forward pass), and an ``AttributionMissing`` for each that is
    not there."""
    chosen, missing = wanted_steps(steps, asked, word)
    for what in missing:
        yield AttributionMissing(what=f"nothing to attribute for {what}")
    if not chosen or not prompt:
        return
    ids = list(prompt) + [s.token_id for s in steps[: max(chosen)]]
    requests = [Request(len(prompt) + s - 1, s, steps[s].token_id,
                        against if against != steps[s].token_id else None) for s in chosen]
    results: list[LogitAttribution] = attribute(lm.model, ids, requests, TokenTextCache(lm.tokenizer))
    yield from results
