"""``--salience``: the strategy runs as it would; before its final event, the salience of the chosen step's
token (``salience.salience_events``), computed from the run's own prompt and tokens."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from playground.config import RunSettings
from playground.config.salience import SalienceSettings
from playground.engine.attribution.salience import salience_events
from playground.engine.run_context import RunContext
from playground.engine.strategies import Runner, call_runner
from playground.events import Event, RunFinished, RunStarted
from playground.models.loaded import LoadedModel


def run_with_salience(runner: Runner, lm: LoadedModel, settings: RunSettings, context: RunContext | None = None
                      ) -> Iterator[Event]:
    context = RunContext.of(context)
    group = settings.group(SalienceSettings)
    methods = group.methods()
    events = call_runner(runner, lm, settings, context)  # the strategy's own checks, before the first event
    return _with_salience(events, lm, group, methods, context)


def _with_salience(events: Iterator[Event], lm: LoadedModel, group: SalienceSettings, methods: tuple[str, ...],
                   context: RunContext) -> Iterator[Event]:
    prompt: tuple[int, ...] = ()
    for event in events:
        if isinstance(event, RunStarted):
            prompt = event.prompt_token_ids
        if isinstance(event, RunFinished) and event.token_ids and not context.stopped():
            output = event.token_ids
            step = group.salience_step if group.salience_step >= 0 else len(output) - 1
            if step < len(output):
                yield from salience_events(lm, prompt, output, step, methods, group.ig_steps, group.ig_rule,
                                           context.stopped, context.progress, group.occlude)
                if context.stopped():  # Stop came during the maps: the final event says they were cut
                    event = dataclasses.replace(event, cut_short=(*event.cut_short, "salience"))
        yield event
