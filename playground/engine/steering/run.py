"""A steered run: ``--steer``'s wrapper around every strategy that takes it, and the observer that records what
the steering did at each token.

``run_steered(runner, lm, settings, context)`` reads and checks the vectors (``ConfigError`` naming the file, its
width or blocks and the model, before the first event), then runs the strategy with ``SteeringHooks`` installed on
the target model while the run's generator computes each event (so prefill and every pass of every step of every
strategy are steered, and two interleaved runs never see each other's hooks). The observer it attaches to the
run's decode loop (``context.observers``) yields ``SteeringStarted``, ``SteeringNorms`` and a ``SteerStep`` per kept
token (``playground.events.steering``).

Live strength: ``context.steering`` (a ``LiveStrength``, set by the window's slider) is re-read before each model
pass of the target; the next token uses the new value, the earlier tokens' cache stays as it was computed. Each
``SteerStep`` records the strengths its pass used and whether they changed.

A strength that makes the logits non-finite ends the run with ``stop_reason="non_finite"`` and a note saying so
(its ``RunFinished`` made here from the tokens kept so far), before any token is chosen from them.

The unsteered comparison (``--steer-compare``) runs the model unsteered on the same tokens in its own KV cache (one
more pass per step, the prompt read once), inside the step's time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from transformers import DynamicCache

from playground.config import RunSettings
from playground.config.errors import ConfigError
from playground.config.steering import SteeringSettings
from playground.engine.forward import keep_last_logits
from playground.engine.observe import Observer
from playground.engine.run_context import RunContext
from playground.engine.speculative.rollback import keep_past, roll_back
from playground.engine.steering.files import load_vector
from playground.engine.steering.hooks import SteeringDiverged, SteeringHooks
from playground.engine.steering.vector import SteeringVector, model_width
from playground.engine.strategies import Runner, call_runner
from playground.events import Event, PrefillDone, RunFinished, RunStarted, TokenStep
from playground.events.steering import SteeringNorms, SteeringStarted, SteeringVectorInfo, SteerStep
from playground.models.anatomy import anatomy_of
from playground.models.loaded import LoadedModel

TARGET_ONLY = ("the target model is steered (its own passes, also the jacobi drafter's); a drafter, amateur or "
               "cheap model that is another model (its first layers, a quantized copy, a small model) is not, as "
               "llama.cpp steers the target's context only")


def steering_vectors(lm: LoadedModel, steering: SteeringSettings) -> list[tuple[str, SteeringVector, float]]:
    """Each ``--steer``'s (file, vector, strength), read and checked against ``lm``."""
    anatomy = anatomy_of(lm.model)
    hidden = model_width(lm.model)
    found = []
    for path, strength in steering.specs():
        vector = load_vector(path)
        vector.check_fits(hidden, anatomy.count, lm.name, source=path)
        found.append((path, vector, strength))
    return found


def run_steered(runner: Runner, lm: LoadedModel, settings: RunSettings, context: RunContext | None = None
                ) -> Iterator[Event]:
    context = RunContext.of(context)
    steering = settings.group(SteeringSettings)
    found = steering_vectors(lm, steering)
    span = steering.layer_range()
    vectors = [vector.within(span) for _, vector, _ in found]
    layers = tuple(sorted({n for v in vectors for n in v.layers}))
    if not layers:
        names = ", ".join(path for path, _, _ in found)
        raise ConfigError(f"--steer-layers {steering.steer_layers}: the vectors ({names}) have no direction for "
                          f"those blocks (they have {sorted({n for _, v, _ in found for n in v.layers})})")
    strengths = tuple(strength for _, _, strength in found)
    hooks = SteeringHooks(lm.model, vectors, strengths, layers, context.steering, lm.device)
    infos = tuple(SteeringVectorInfo(name=v.name, source=path, strength=strength, layers=v.layers,
                                     norms=tuple(v.norm(n) for n in v.layers), method=v.method, front=v.front)
                  for (path, _, strength), v in zip(found, vectors, strict=True))
    started = SteeringStarted(vectors=infos, layers=layers, model_layers=anatomy_of(lm.model).count,
                              hidden_size=model_width(lm.model), compare=steering.steer_compare,
                              live=context.steering is not None, target_only=TARGET_ONLY)
    observer = SteerObserver(lm, hooks, started)
    inner = dataclasses.replace(context, observers=(*context.observers, observer))
    events = call_runner(runner, lm, settings, inner)  # the strategy's own checks, before the first event
    return _steered(events, hooks, lm)


def _steered(events: Iterator[Event], hooks: SteeringHooks, lm: LoadedModel) -> Iterator[Event]:
    seen = _Seen()
    try:
        with hooks.installed():
            while True:
                try:
                    with hooks.active(), torch.inference_mode():
                        event = next(events)
                except StopIteration:
                    return
                except SteeringDiverged as error:
                    yield seen.finished(lm, str(error))
                    return
                seen.note(event)
                yield event  # the hooks rest while the consumer has the event (another pane may run)
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


class _Seen:
    """What a run yielded so far: enough to end it (``RunFinished``) when its steering diverged mid-step."""

    def __init__(self) -> None:
        self.started: RunStarted | None = None
        self.prefill: PrefillDone | None = None
        self.tokens: list[int] = []
        self.decode_ms = 0.0

    def note(self, event: Any) -> None:
        if isinstance(event, RunStarted) and self.started is None:
            self.started = event
        elif isinstance(event, PrefillDone) and self.prefill is None:
            self.prefill = event
        elif isinstance(event, TokenStep):
            self.tokens.append(event.token_id)
            self.decode_ms += event.step_ms

    def finished(self, lm: LoadedModel, note: str) -> RunFinished:
        seconds = self.decode_ms / 1000
        return RunFinished(
            token_ids=tuple(self.tokens), text=lm.tokenizer.decode(self.tokens, skip_special_tokens=True),
            stop_reason="non_finite", tokens_per_s=len(self.tokens) / seconds if seconds > 0 else 0.0,
            prefill_ms=self.prefill.prefill_ms if self.prefill else 0.0, decode_ms=self.decode_ms,
            prompt_tokens=self.prefill.prompt_tokens if self.prefill else 0, model_name=lm.name,
            model_path=lm.path, device=str(lm.device), dtype=lm.dtype_name,
            stop_note=f"{note} (stopped before step {len(self.tokens)})")


class SteerObserver(Observer):
    """The steering's events on the decode loop (its hooks are the wrapper's)."""

    def __init__(self, lm: LoadedModel, hooks: SteeringHooks, started: SteeringStarted) -> None:
        self.lm = lm
        self.hooks = hooks
        self.start_event = started
        self.unsteered = UnsteeredContext(lm, hooks) if started.compare else None
        self.previous: tuple[float, ...] | None = None
        self.steps: list[SteerStep] = []
        self.norms_sent = False

    def started(self, loop: Any) -> list[Any]:
        self.hooks.prompt_len = len(loop.prompt_ids)
        return [self.start_event]

    def after_step(self, loop: Any, picked: Any) -> None:
        hooks = self.hooks
        hooks.norms_done = True
        used = hooks.used
        changed = self.previous is not None and used != self.previous
        self.previous = used
        units = 1 if picked.rows else len(picked.tokens)
        values = hooks.readings(list(picked.seen)[:units])
        compare: list[tuple[float, float, float]] = []
        if self.unsteered is not None and not picked.rows and picked.tokens and picked.logits is not None:
            compare = self.unsteered.compare(loop.prompt_ids + loop.generated, picked.tokens, picked.logits)
        self.steps = []
        for j in range(len(values)):
            projections = tuple(
                tuple(None if (n not in v.directions or values[j][i][k] != values[j][i][k]) else values[j][i][k]
                      for i, n in enumerate(hooks.layers))
                for k, v in enumerate(hooks.vectors))
            extra = dict(zip(("steered_prob", "unsteered_prob", "kl"), compare[j], strict=True)) \
                if j < len(compare) else {}
            self.steps.append(SteerStep(step=picked.first + j, strengths=used, changed=changed and j == 0,
                                        projections=projections, **extra))

    def step_events(self, loop: Any, picked: Any, units: int) -> Sequence[Sequence[Any]] | None:
        if not self.steps:
            return None
        out: list[list[Any]] = [[step] for step in self.steps[:units]]
        if not self.norms_sent and out:
            self.norms_sent = True
            out[0].insert(0, SteeringNorms(layers=self.hooks.layers, residual_norms=self.hooks.residual_norms(),
                                           positions=self.hooks.norm_positions))
        return out


class UnsteeredContext:
    """The unsteered model on the run's tokens, in its own KV cache (``--steer-compare``)."""

    def __init__(self, lm: LoadedModel, hooks: SteeringHooks) -> None:
        self.lm = lm
        self.hooks = hooks
        self.cache: Any = None
        self.fed: list[int] = []
        self.ms = 0.0

    def logits_for(self, before: list[int], tokens: list[int]) -> torch.Tensor:
        """The unsteered logits [len(tokens), vocab] (float32) predicting each of ``tokens`` after ``before``."""
        start = time.perf_counter()
        seq = before + tokens[:-1]
        keep = 0
        limit = min(len(self.fed), len(before) - 1)
        while keep < limit and self.fed[keep] == seq[keep]:
            keep += 1
        if self.cache is None:
            self.cache = DynamicCache(config=self.lm.model.config)
            keep_past(self.cache)
        elif self.cache.get_seq_length() > keep:
            roll_back(self.cache, keep)
        keep = min(keep, self.cache.get_seq_length())
        feed = torch.tensor([seq[keep:]], device=self.lm.device)
        with self.hooks.unsteered():
            out = self.lm.model(input_ids=feed, cache=self.cache, use_cache=True,
                                **keep_last_logits(self.lm.model, len(tokens)))
        self.fed = seq
        self.ms += (time.perf_counter() - start) * 1000
        return out.logits[0, -len(tokens):].float()

    def compare(self, before: list[int], tokens: list[int], steered: torch.Tensor) -> list[tuple[float, float, float]]:
        """Per token: (steered prob, unsteered prob, KL(steered ‖ unsteered) in nats) of the raw distributions."""
        unsteered = self.logits_for(before, tokens)
        log_s = torch.log_softmax(steered[: len(tokens)].float(), dim=-1)
        log_u = torch.log_softmax(unsteered, dim=-1)
        kl = (log_s.exp() * (log_s - log_u)).sum(dim=-1)
        index = torch.tensor(tokens, device=log_s.device)[:, None]
        p_s = log_s.gather(-1, index)[:, 0].exp()
        p_u = log_u.gather(-1, index)[:, 0].exp()
        return [(float(a), float(b), max(0.0, float(c))) for a, b, c in
                zip(p_s.tolist(), p_u.tolist(), kl.tolist(), strict=True)]
