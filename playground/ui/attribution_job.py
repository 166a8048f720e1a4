"""On-demand logit attribution in the window (a part of ``MainWindow``): a view asks for a step of the selected run
(``View.attributes``: its ``attribution_requested(step, against)`` signal); a ``JobKind.ATTRIBUTE`` job reads the
run's prompt and tokens once more with the loaded model (one forward pass) and its ``LogitAttribution`` joins the
run's events, so the views draw it and File ▸ Save run keeps it (a reopened run shows it without the model)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from playground.state import Run, Session
from playground.ui.banner import MessageBanner
from playground.ui.job_kinds import JobKind
from playground.ui.status_bar import RunStatusBar
from playground.ui.worker import GeneratorJob, JobBody


class AttributionJobs:
    session: Session
    banner: MessageBanner
    status: RunStatusBar
    job: GeneratorJob | None

    if TYPE_CHECKING:  # the window's (MainWindow, ModelChoice, BackgroundJobs); for the type checker only
        @property
        def busy(self) -> bool: ...
        @property
        def lm(self) -> Any: ...
        source: Any
        def _start_job(self, body: JobBody, kind: JobKind, take: Callable[[list[Any]], None] | None = None,
                       follower: Any = None, then: Callable[[], None] | None = None) -> None: ...

    def attribute_step(self, step: int, against: int = -1) -> None:
        """Attribute ``step`` of the selected run (its token over ``against``; -1: the runner-up)."""
        run, lm = self.session.selected, self.lm
        why = self._cannot_attribute(run, lm, step)
        if why:
            self.banner.show_info(why)
            return
        assert run is not None and run.started is not None
        source = self.source  # the local model (``lm`` is its model)
        prompt, steps = run.started.prompt_token_ids, list(run.steps)

        def body(should_stop, progress) -> Iterator[Any]:
            return source.attribute(prompt, steps, step, None if against < 0 else against)

        self.session.live = run  # its events fold into this run, and are drawn while it is selected
        self.status.showMessage(f"Attributing step {step}…")
        self._start_job(body, JobKind.ATTRIBUTE)
        if self.job is not None:
            self.job.finished.connect(lambda r=run: self._attributed(r))

    def _attributed(self, run: Run) -> None:
        if self.session.live is run:
            self.session.live = None

    def _cannot_attribute(self, run: Run | None, lm: Any, step: int) -> str:
        if self.busy:
            return "Wait for the current job to finish (or Stop it) before attributing a step."
        if run is None or run.started is None or not run.steps:
            return "Attribute: show a greedy or sampled run first."
        if lm is None:
            return "Attribute needs the model loaded here (a server does not expose its layers)."
        if run.started.model_name != lm.name:
            return f"Attribute: run #{run.index + 1} was decoded by {run.started.model_name}; load it first."
        if not 0 <= step < len(run.steps):
            return f"Attribute: run #{run.index + 1} has steps 0 to {len(run.steps) - 1}."
        return ""
