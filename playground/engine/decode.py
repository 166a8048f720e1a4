"""The one decode loop (gpt-fast's ``decode_n_tokens``, nanochat's ``generate``): what every strategy does around
its own step.

``DecodeLoop`` owns the start event, the chunked prefill (progress and Stop between chunks), the step budget
(``max_new_tokens`` or the context, whichever ends first), Stop before each step, forced tokens, step timing,
incremental token text, EOS and stop strings, the run's observers (``playground.engine.observers``: the lens, the
KV cache's measurements, the run history) and the final event. A strategy supplies one step: given the step index
and the forced token (if any), it runs its model(s), picks one or more tokens and says which events they make; a
step over several rows (beam search: rows = beams) picks no token of the sequence and says when the search ended.
The token ids live in one preallocated buffer (no ``torch.cat`` of the whole sequence per token).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from playground.config import RunSettings
from playground.config.stop_strings import StopStringWatch, end_reason
from playground.engine.observe import Observer, observers_for, overrides
from playground.engine.run_events import RunRecorder
from playground.engine.token_text import IncrementalDecoder
from playground.events import Event, RunFinished, StopReason
from playground.models.loaded import LoadedModel

# (texts of the tokens the loop kept, the step's milliseconds) -> what the loop yields for the step, in order: its
# events (a strategy that holds tokens back, as the cascade's per-response mode, yields its own records instead)
EventsOf = Callable[[list[str], float], Sequence[Any]]


@dataclass
class Picked:
    """What one step chose: its tokens (several for a speculative round) and how to turn them into events once
    the loop has decoded their text and cut them at the first end (EOS, a stop string, the budget)."""

    tokens: list[int]
    events: EventsOf
    stopped: bool = False  # Stop came inside the step (e.g. between a long catch-up's chunks): nothing to keep
    # For the observers that read the step's model pass (the lens): the model's own logits [tokens, vocab] where
    # each token was predicted, and its (batch row, position) in the pass the step ran inside ``loop.watching()``.
    logits: torch.Tensor | None = None
    seen: Sequence[tuple[int, int]] = ((0, -1),)
    # A step over rows (beam search): it adds no token to the sequence, counts one step of the budget, and
    # ``ended`` says the search is over.
    rows: bool = False
    ended: bool = False
    first: int = 0  # the step number of its first token (set by the loop)
    # The run ends after this step's tokens, with this reason and note (a constraint that is complete, or that no
    # token can follow), unless an end token, a stop string or the budget ended it first.
    ends: tuple[StopReason, str] | None = None


@dataclass
class TokenBuffer:
    """The prompt and the generated ids in one preallocated [1, capacity] tensor; ``view`` is the filled part."""

    data: torch.Tensor
    length: int

    @classmethod
    def of(cls, prompt_ids: list[int], room: int, device: torch.device) -> TokenBuffer:
        data = torch.empty((1, len(prompt_ids) + max(room, 0)), dtype=torch.long, device=device)
        data[0, : len(prompt_ids)] = torch.tensor(prompt_ids, dtype=torch.long)
        return cls(data, len(prompt_ids))

    @property
    def view(self) -> torch.Tensor:
        return self.data[:, : self.length]  # [1, n]

    @property
    def last(self) -> torch.Tensor:
        return self.data[:, self.length - 1 : self.length]  # [1, 1]

    def append(self, token_id: int | list[int]) -> None:
        """One token, or one per row (a batch of sequences: the KV lab's parallel samples). The buffer holds the
        prompt and the run's whole budget, and the loop never keeps a token past the budget."""
        # A plain int fills in place (no tensor made per token); a row's list is copied over once.
        self.data[:, self.length] = token_id if isinstance(token_id, int) else torch.tensor(token_id, dtype=torch.long)
        self.length += 1

    def repeated(self, rows: int) -> TokenBuffer:
        """A copy with ``rows`` identical rows (sequences that share the prompt)."""
        return TokenBuffer(self.data.repeat(rows, 1), self.length)


@dataclass
class DecodeLoop:
    """One run's frame. ``max_steps`` and the budget reason come from the settings and the context length."""

    lm: LoadedModel
    settings: RunSettings
    record: RunRecorder
    prompt_ids: list[int]
    prompt_text: str
    generated: list[int] = field(default_factory=list)
    stop_reason: StopReason = "max_new_tokens"
    cut_short: tuple[str, ...] = ()
    stop_note: str = ""  # why it ended, in words, where the reason needs them (``RunFinished.stop_note``)

    def __post_init__(self) -> None:
        self.context = self.record.context
        self.observers: list[Observer] = observers_for(self.lm, self.settings, self.context)
        self._watchers = [o for o in self.observers if overrides(o, "watch")]
        self._after = [o for o in self.observers if overrides(o, "after_step")]
        self._step_events = [o for o in self.observers if overrides(o, "step_events")]
        self._opened = False
        self.taken = 0  # steps of the budget taken: tokens, or a search's steps (its forced prefix first)
        self.rows = 1  # sequences the cache holds (a beam search's beams)
        room = self.lm.context_length - len(self.prompt_ids)
        self.max_steps = min(self.settings.max_new_tokens, room)
        self.budget_reason: StopReason = "max_new_tokens" if self.max_steps == self.settings.max_new_tokens \
            else "context_full"
        self.stop_reason = self.budget_reason
        self.ids = TokenBuffer.of(self.prompt_ids, self.max_steps, self.lm.device)
        self.decoder = IncrementalDecoder(self.lm.tokenizer, self.prompt_ids)
        self.stop_watch = StopStringWatch(self.settings.stop_strings)
        self.eos_ids = set(self.lm.eos_token_ids)
        self.forced = tuple(self.settings.forced_token_ids)
        self.cache: Any = None
        self.logits: torch.Tensor | None = None  # the prefill's last logits [1, vocab] float32, if it read any
        self.deferred = 0  # prompt tokens the prefill left to the first step
        # Undoes tokens after a step (phrase bans: ``playground.engine.bans.BanGuard``); None: nothing is undone.
        self.guard: Any = None

    @property
    def defer(self) -> int:
        """Prompt tokens an observer wants the first step to read (the lens records that step's layers)."""
        return max((o.defer for o in self.observers), default=0)

    def started(self) -> Event:
        return self.record.started(self.prompt_ids, self.prompt_text)

    def opening(self) -> Iterator[Event]:
        """The observers' start events (once; the prefill yields them if the strategy did not)."""
        if not self._opened:
            self._opened = True
            for observer in self.observers:
                yield from observer.started(self)

    def watching(self) -> AbstractContextManager[Any]:
        """Around a step's model pass: what the observers watch of it (the lens's layer hooks)."""
        if not self._watchers:
            return _NOTHING
        scope = ExitStack()
        for observer in self._watchers:
            watch = observer.watch(self)
            if watch is not None:
                scope.enter_context(watch)
        return scope

    def prefill(self, defer: int = 0, cache: Any = None, ids: torch.Tensor | None = None
                ) -> Generator[Event, None, bool]:
        """Read the prompt (``ids``: the tokens the strategy reads first, the prompt's by default) but its last
        ``defer`` tokens (at least those an observer asks for: the first step reads them); False when Stop came
        between chunks (the run then ends "stopped" with no step)."""
        yield from self.opening()
        defer = max(defer, self.defer)
        self.deferred = defer
        prefilled = yield from self.record.prefill(self.ids.view if ids is None else ids, defer=defer, cache=cache)
        if prefilled is None:
            self.stop_reason = "stopped"
            return False
        logits, self.cache = prefilled
        self.logits = logits.float() if logits is not None else None
        return True

    def forced_at(self, step: int) -> int | None:
        return self.forced[step] if step < len(self.forced) else None

    def steps(self, step: Callable[[int, int | None], Picked], *, start: int = 0) -> Iterator[Any]:
        """Run ``step(index, forced token or None)`` until the budget, Stop, EOS or a stop string ends the run (a
        rows step: until it says the search ``ended``)."""
        if self.stop_reason == "stopped":
            return
        index = start
        after, step_events = self._after, self._step_events
        while self.taken < self.max_steps:
            if self.record.context.stopped():
                self.stop_reason = "stopped"
                return
            if self.guard is not None:
                self.guard.before_step(self)
            self.record.step_started()
            picked = step(index, self.forced_at(self.taken))
            picked.first = index if picked.rows else len(self.generated)
            if after and not picked.stopped:
                for observer in after:  # inside the step's time, as its own recording
                    observer.after_step(self, picked)
            step_ms = self.record.step_ended()
            if picked.stopped:
                self.stop_reason = "stopped"
                return
            texts: list[str] = []
            ended: StopReason | None = None
            if picked.rows:  # a search over rows says when it is over; it names its own reason after the loop
                self.taken += 1
                ended = self.budget_reason if picked.ended else None
            for token in picked.tokens[: self.max_steps - self.taken]:
                self.ids.append(token)
                text = self.decoder.push(token)
                texts.append(text)
                self.generated.append(token)
                self.taken += 1
                ended = end_reason(token, text, self.eos_ids, self.stop_watch)
                if ended is not None:
                    break
            if ended is None and picked.ends is not None and len(texts) == len(picked.tokens):
                ended, self.stop_note = picked.ends
            events = picked.events(texts, step_ms)
            if step_events:
                events = self._with_observed(events, picked, 1 if picked.rows else len(texts))
            yield from events
            index += 1
            if self.guard is not None and not picked.rows and ended != "eos":
                undone = self.guard.after_step(self, texts, events)
                if undone is not None:  # rolled back: the next step decodes the first undone position again
                    rolled, ended = undone[0], None
                    yield from rolled
                    if undone[1] is not None:
                        ended, self.stop_note = undone[1]
                    index = len(self.generated)
            if ended is not None:
                self.stop_reason = ended
                return

    def rewind(self, keep: int) -> None:
        """Forget the generated tokens from ``keep`` on (a rollback): the ids, the text, the budget, the stop-string
        watch. The strategy's cache and samplers are the caller's to roll back."""
        del self.generated[keep:]
        self.ids.length = len(self.prompt_ids) + keep
        self.taken = keep
        self.decoder = IncrementalDecoder(self.lm.tokenizer, self.prompt_ids + self.generated)
        self.stop_watch = StopStringWatch(self.settings.stop_strings)
        if self.generated:
            self.stop_watch.hit(self.lm.tokenizer.decode(self.generated, skip_special_tokens=False))

    def _with_observed(self, events: Sequence[Any], picked: Picked, units: int) -> list[Any]:
        """The step's events with the observers' before each of its last ``units`` (its kept tokens' own)."""
        units = min(units, len(events))
        before: list[list[Any]] = [[] for _ in range(units)]
        for observer in self._step_events:
            for j, extra in enumerate((observer.step_events(self, picked, units) or ())[:units]):
                before[j].extend(extra)
        head = len(events) - units
        out = list(events[:head])
        for j in range(units):
            out.extend(before[j])
            out.append(events[head + j])
        return out

    def finished(self, figures: dict[str, float] | None = None, steps: int | None = None, **extra: Any
                 ) -> RunFinished:
        """The final event; ``steps``: decode steps for the speed figure (default: the tokens generated)."""
        text = self.lm.tokenizer.decode(self.generated, skip_special_tokens=True)
        for observer in self.observers:
            observer.finished(self)  # e.g. the history: the suffix drafter learns from earlier runs
        done = self.record.finished(self.generated, text, self.stop_reason,
                                    steps=len(self.generated) if steps is None else steps, **extra)
        changes: dict[str, Any] = {"cut_short": self.cut_short, "stop_note": self.stop_note}
        if figures is not None:
            changes["figures"] = figures
        return dataclasses.replace(done, **changes)


_NOTHING = nullcontext()
