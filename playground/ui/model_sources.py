"""Where a run's tokens come from: a model loaded here or a model on a server, behind one interface.

The window holds one ``ModelSource`` and asks it to describe itself, check settings, run, and turn a click on an
alternative into a branch; it never asks which kind it holds. Both yield the same events: views tell a server's
run from a local one by the events' own fields (the start event's device, whether a step has probabilities).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playground.config import ConfigError, RunSettings
from playground.config.catalog import Progress, StopCheck
from playground.config.steering import LiveStrength
from playground.errors import UserError
from playground.events.salience import SALIENCE_METHODS
from playground.models.anatomy import model_support
from playground.models.loaded import LoadedModel
from playground.remote.source import RemoteSource
from playground.state import Branch, Run, Session
from playground.ui.server_model import (
    branch_remote_run,
    check_remote_run,
    model_label,
    server_details,
)
from playground.ui.views.base import is_remote_run

# (the run's settings, the runs list's branch, what the source needs to continue it: a server's RemoteBranch)
BranchPlan = tuple[RunSettings, Branch, Any]


@dataclass(frozen=True)
class SourceLabels:
    """What the window shows of a source: the picker's and status bar's labels, and what it supports."""

    name: str
    device: str  # "cpu", "cuda:0", or "remote: llama.cpp"
    dtype: str
    family: str = ""  # the status bar's family summary ("" hides it)
    family_details: str = ""
    blocked_strategies: dict[str, str] = field(default_factory=dict)  # strategy -> why this model cannot run it
    blocked_groups: dict[str, str] = field(default_factory=dict)  # settings group -> why


class ModelSource(ABC):
    @property
    @abstractmethod
    def name(self) -> str: ...

    @abstractmethod
    def labels(self) -> SourceLabels: ...

    @abstractmethod
    def check(self, settings: RunSettings) -> None:
        """The run's up-front checks (``ConfigError``), before a run exists."""

    @abstractmethod
    def run(self, settings: RunSettings, should_stop: StopCheck, progress: Progress, plan: Any = None,
            chooser: Any = None, steering: LiveStrength | None = None) -> Iterator[Any]:
        """The run's events (called on the worker thread); ``plan`` is what ``branch`` returned for it; ``chooser``:
        step mode, the user picks each token (where ``takes_chooser``); ``steering``: a steered run's live strength
        (the steering view's slider sets it)."""

    def takes_chooser(self, settings: RunSettings) -> bool:
        """Whether a run of ``settings`` here lets the user pick its tokens (step mode)."""
        return False

    @abstractmethod
    def branch(self, session: Session, run: Run, step: int, token_id: int) -> BranchPlan | None:
        """Continue ``run`` from ``step`` with ``token_id``: the plan, None when there is nothing to continue, or
        ``ConfigError`` saying why this source cannot continue it."""

    def tokenizer(self) -> Any:
        """The tokenizer words are read with here (the form shows what a logit bias resolves to), or None."""
        return None

    def vocab_size(self) -> int | None:
        """The size of the model's head (the watermark detector's green lists are drawn over it), or None."""
        return None

    def text_entropies(self, ids: Sequence[int]) -> list[float]:
        """SWEET's entropies over a text's ids (bits; the watermark detector's panel, off the window's thread)."""
        raise UserError("SWEET needs the loaded model's entropies: load a model here (a server does not give them)")


class LocalModel(ModelSource):
    def __init__(self, lm: LoadedModel) -> None:
        self.lm = lm

    @property
    def name(self) -> str:
        return self.lm.name

    def tokenizer(self) -> Any:
        return self.lm.tokenizer

    def vocab_size(self) -> int | None:
        return self.lm.vocab_size

    def text_entropies(self, ids: Sequence[int]) -> list[float]:
        """One teacher-forced pass of the loaded model over ``ids``: its entropy where each was predicted."""
        from playground.engine.watermark.score import text_entropies

        return text_entropies(self.lm, ids)

    def labels(self) -> SourceLabels:
        support = model_support(self.lm.model)
        return SourceLabels(self.lm.name, str(self.lm.device), self.lm.dtype_name, support.summary(),
                            support.details(), support.blocked_strategies, support.blocked_groups)

    def check(self, settings: RunSettings) -> None:
        from playground.config.catalog import get_strategy

        get_strategy(settings.strategy)
        settings.validate()

    def run(self, settings: RunSettings, should_stop: StopCheck, progress: Progress, plan: Any = None,
            chooser: Any = None, steering: LiveStrength | None = None) -> Iterator[Any]:
        from playground.engine.run_context import RunContext
        from playground.engine.strategies import run_strategy

        # progress: building a quantized copy; steering: the run reads its strength from it before each pass
        return run_strategy(self.lm, settings, RunContext(should_stop=should_stop, steering=steering), progress,
                            chooser=chooser)

    def attribute(self, prompt: Any, steps: Any, step: int, against: int | None) -> Iterator[Any]:
        """A view's Attribute: ``step`` of a run decoded here, attributed in one forward pass (ui/attribution_job)."""
        from playground.engine.dla.run import attribute_run

        return attribute_run(self.lm, prompt, steps, (step,), against=against)

    def train_tuned_lens(self, should_stop: StopCheck, progress: Progress) -> Path | None:
        """Tools → Train tuned lens: the model's translators trained and saved (None: stopped, nothing saved)."""
        from playground.engine.layers.tune_job import train_for_model

        return train_for_model(self.lm.model, self.lm.tokenizer, should_stop, progress)

    def explain_step(self, prompt: Sequence[int], output: Sequence[int], step: int, settings: RunSettings,
                     should_stop: StopCheck, progress: Progress) -> Iterator[Any]:
        """The salience view's "Explain step": the step's maps (``playground.ui.salience_job``)."""
        from playground.config.salience import SalienceSettings
        from playground.engine.attribution.salience import salience_events

        group = settings.group(SalienceSettings)
        methods = group.methods() or SALIENCE_METHODS
        return salience_events(self.lm, prompt, output, step, methods, group.ig_steps, group.ig_rule,
                               should_stop, progress, group.occlude)
    def steer_build_plan(self, contrast: str, method: str | None, layers: str, out: str) -> Any:
        """The "Build a steering vector" dialog's fields, checked (a ``BuildPlan``; ConfigError saying what is
        wrong)."""
        from playground.engine.steering.contrast_sets import BuildPlan

        return BuildPlan.of(contrast, method, layers, out)

    def build_steering_vector(self, plan: Any, should_stop: StopCheck, progress: Progress) -> Path | None:
        """The dialog's job: the vector built on the loaded model and saved (None: stopped, nothing saved)."""
        from playground.engine.steering.build import build_and_save
        from playground.models.anatomy import anatomy_of

        return build_and_save(self.lm, plan.contrast, plan.out, method=plan.method,
                              layers=plan.layers(anatomy_of(self.lm.model).count), should_stop=should_stop,
                              progress=progress)

    def takes_chooser(self, settings: RunSettings) -> bool:
        from playground.config.catalog import SHARED, get_strategy

        # --quant passes none on; --steer's wrapper keeps it
        wrapped = any(s.wrapper and not s.keeps_chooser and settings.group(s.group).active() for s in SHARED)
        return not wrapped and get_strategy(settings.strategy).takes_chooser  # the catalog entry says

    def branch(self, session: Session, run: Run, step: int, token_id: int) -> BranchPlan | None:
        if is_remote_run(run):  # a server's run: only that server can continue it (its message says so)
            branch_remote_run(run, step, token_id, None, "")
        # A quantized run was made from the loaded model itself (its start event says which): the same weights,
        # quantized again on branching. A saved run from before base_model named it "<model> · <method>".
        started = run.started
        made_with = (started.base_model or started.model_name.split(" · ")[0]) if started is not None else ""
        if started is not None and (started.model_path, made_with) != (self.lm.path, self.lm.own_name):
            # Token ids only mean something to the tokenizer that produced them.
            raise ConfigError(f"run #{run.index + 1} was made with {started.model_name}; load that model "
                              "again to branch from it")
        settings, made = session.branch_settings(run.index, step, token_id)
        return settings, made, None


class ServerModel(ModelSource):
    def __init__(self, source: RemoteSource, info: Any, model: str) -> None:
        self.source, self.info, self.model = source, info, model

    @property
    def name(self) -> str:
        return model_label(self.model)

    def labels(self) -> SourceLabels:
        return SourceLabels(self.name, f"remote: {self.info.engine}", self.info.ftype)

    def details(self) -> str:
        return server_details(self.source, self.info, self.model)

    def check(self, settings: RunSettings) -> None:
        check_remote_run(self.source, settings, None)

    def run(self, settings: RunSettings, should_stop: StopCheck, progress: Progress, plan: Any = None,
            chooser: Any = None, steering: LiveStrength | None = None) -> Iterator[Any]:
        from playground.remote.decode import run_remote

        # The runner polls should_stop every 50 ms, even while the server is silent.
        return run_remote(self.source, settings, should_stop, plan)

    def branch(self, session: Session, run: Run, step: int, token_id: int) -> BranchPlan | None:
        if not is_remote_run(run):
            raise ConfigError("Load a model to branch: a saved run replays without one, but continuing it needs "
                              "the model")
        return branch_remote_run(run, step, token_id, self.source, self.model)
