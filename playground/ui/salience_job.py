"""Salience on demand: the salience view's "Explain step N" runs the maps of step N of the shown run as a
background job (``JobKind.SALIENCE``: progress in the status bar, Stop ends it), on the model loaded here; the
maps are folded into that run (so a saved run keeps them) and drawn if it is still the shown one.

A part of ``MainWindow`` (its attributes are the window's), as ``background_jobs`` is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from playground.state import Run, Session
from playground.ui.banner import MessageBanner
from playground.ui.job_kinds import JobKind
from playground.ui.model_sources import LocalModel, ModelSource
from playground.ui.runs_list import RunsList
from playground.ui.status_bar import RunStatusBar

if TYPE_CHECKING:
    from playground.models.loaded import LoadedModel
    from playground.ui.run_views import RunViews
    from playground.ui.worker import JobBody


def salience_refusal(run: Run | None, lm: LoadedModel | None, busy: bool) -> str | None:
    """Why step salience cannot be computed now for ``run`` (None when it can)."""
    if busy:
        return "Wait for the current job to finish (or Stop it) before explaining a step."
    if run is None or run.started is None or not run.steps:
        return "Explain step: show a run of tokens first."
    if run.started.remote:
        return "Explain step needs the model's gradients: a server's run cannot be explained; decode it here."
    if lm is None:
        return "Explain step: load the model first (the salience is computed on the model loaded here)."
    if lm.name != run.started.model_name:
        return (f"Explain step: run #{run.index + 1} was decoded by {run.started.model_name}, but {lm.name} is "
                "loaded: load that model to explain its steps.")
    return None


class SalienceJobs:
    """The on-demand salience part of ``MainWindow``."""

    session: Session
    banner: MessageBanner
    status: RunStatusBar
    runs_list: RunsList
    run_views: RunViews
    _salience_run: Run | None
    source: ModelSource | None

    if TYPE_CHECKING:
        @property
        def lm(self) -> LoadedModel | None: ...
        @property
        def busy(self) -> bool: ...
        def _start_job(self, body: JobBody, kind: JobKind, take: Callable[[list[Any]], None] | None = None,
                       follower: Any = None, then: Callable[[], None] | None = None) -> None: ...

    def explain_step(self, step: int) -> None:
        run = self.session.selected
        refusal = salience_refusal(run, self.lm, self.busy)
        if refusal is not None:
            self.banner.show_info(refusal)
            return
        source = self.source
        assert run is not None and run.started is not None and isinstance(source, LocalModel)
        prompt, output, settings = run.started.prompt_token_ids, run.generated_ids, run.settings

        def body(should_stop, progress) -> Iterator[Any]:
            yield from source.explain_step(prompt, output, step, settings, should_stop, progress)

        self._salience_run = run
        self.status.showMessage(f"Explaining step {step} of run #{run.index + 1}…")
        self._start_job(body, JobKind.SALIENCE, take=self._take_salience_items)  # its maps: into the run explained

    def _take_salience_items(self, batch: list[Any]) -> None:
        """The maps of a salience job: into the run they explain, drawn if it is the shown one."""
        run = self._salience_run
        if run is None:
            return
        for event in batch:
            run.apply(event)
        self.runs_list.update_run(run)
        if run is self.session.selected:
            self.run_views.apply(run, batch)
