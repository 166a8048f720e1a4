"""The kinds of background job the window runs, one at a time, and what each kind means for the window.

A job's kind says whose its items are (a run's events go to the window's runs, a model job's to ``ModelChoice``),
what a failure says, whether Stop may end it, and whether the model picker shows its progress: one row per kind
here, read by ``background_jobs`` and ``model_choice`` instead of comparing names.
"""

from __future__ import annotations

from enum import Enum


class JobKind(str, Enum):
    """A background job's kind; its value is the job's name (``GeneratorJob.name``)."""

    # value, failure (the banner's first words; "" when the server dialog answers instead), Stop allowed,
    # a model job (its items go to ModelChoice), the picker's progress bar shows it, waits for its clean-up at exit
    RUN = ("run", "The run failed", True, False, False, False)
    LOAD = ("load", "Could not load the model", False, True, True, False)
    FETCH = ("fetch", "Could not fetch the default model", True, True, True, True)  # pip's temporary folder
    CONNECT = ("connect", "Could not connect to the server", False, True, False, False)
    TEST = ("test", "", False, True, False, False)  # the "Server…" dialog's test: the dialog shows its answer
    TUNE_LENS = ("tune-lens", "Could not train the tuned lens", True, True, True, False)  # Tools → Train tuned lens
    ATTRIBUTE = ("attribute", "Could not attribute the step", True, False, False, False)  # a view's Attribute
    # the salience view's button; its maps go into the run it explains (the job says so when it starts: ``take``)
    SALIENCE = ("salience", "Could not explain the step", True, False, False, False)
    # the "Build a steering vector" dialog's build: its items (the file written) and its progress go to the dialog
    STEER_BUILD = ("steer-build", "Could not build the steering vector", True, True, True, False)

    failure: str
    stoppable: bool
    model_job: bool
    shows_progress: bool
    cleans_up_at_exit: bool

    def __new__(cls, value: str, failure: str, stoppable: bool, model_job: bool, shows_progress: bool,
                cleans_up_at_exit: bool) -> JobKind:
        kind = str.__new__(cls, value)
        kind._value_ = value
        kind.failure = failure
        kind.stoppable = stoppable
        kind.model_job = model_job
        kind.shows_progress = shows_progress
        kind.cleans_up_at_exit = cleans_up_at_exit
        return kind

    def __str__(self) -> str:  # "fetch", in messages, as the job's name
        return self.value
