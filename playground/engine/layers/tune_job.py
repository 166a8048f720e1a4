"""Training the loaded model's tuned lens as a job: collect the calibration text's hidden states, train with
progress and Stop, save where ``--lens-kind tuned`` finds it. (Apart from ``tuned``, which ``lens`` imports.)"""

from __future__ import annotations

from pathlib import Path

from playground.engine.layers.lens import LayerStack
from playground.engine.layers.tuned import (
    calibration_ids,
    collect_hidden,
    lens_path_of,
    save_tuned_lens,
    train_tuned_lens,
)
from playground.engine.run_context import Progress, RunContext, StopCheck


def train_for_model(model, tokenizer, should_stop: StopCheck | None = None, progress: Progress | None = None, *,
                    steps: int = 40, tokens: int = 4096) -> Path | None:
    """Train the model's tuned lens on the calibration text and save it where ``--lens-kind tuned`` finds it; the
    path, or None when Stop came first (nothing saved). ``progress(message, fraction)`` between steps. (The
    window's job gives its stop check and progress as they are: they are made into the job's run context here.)"""
    context = RunContext.of(should_stop, progress)
    stack = LayerStack.of(model)
    context.report("Tuned lens: reading the calibration text through every layer…", 0.0)
    hidden, final = collect_hidden(stack, calibration_ids(tokenizer, "calibration", tokens))
    lens = None
    training = train_tuned_lens(stack, hidden, final, steps=steps, context=context)
    while True:
        try:
            step = next(training)
        except StopIteration as done:
            lens = done.value
            break
        context.report(f"Tuned lens: step {step.step} of {step.steps}, mean KL {step.loss:.2f} nats", step.step / steps)
    if context.stopped():
        return None
    lens.info.update({"steps": str(steps), "tokens": str(hidden.shape[1])})
    return save_tuned_lens(lens, lens_path_of(model, stack.count))
