"""The tokens view learns which distribution a run's numbers are from its start events' ``token_numbers``, never
from their classes: a run decoded here shows two distributions to choose from, a server's run the one it sent, and a
start event of any other source is read the same way (live and from a saved run)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from playground.config import RunSettings
from playground.events import RunStarted, TokenNumbers
from playground.events.remote import RemoteStarted
from playground.remote.stream import no_probs_step
from playground.state import Run


def _started() -> RunStarted:
    return RunStarted(strategy="greedy", prompt_text="Hi", prompt_token_ids=(1, 2), forced_token_ids=(),
                      model_name="m", model_path="/m", device="cpu", dtype="float32", settings={})


def _remote(distribution: str, note: str) -> RemoteStarted:
    return RemoteStarted(engine="llama.cpp", engine_version="b1", base_url="http://h/v1", model="m.gguf",
                         endpoint="chat/completions", distribution=distribution, distribution_note=note,
                         top_logprobs=5, timings="server", n_ctx=4096, speculative=False)


@dataclass(frozen=True)
class OtherSourceStarted:
    """A start event of a model source the view has never heard of: only its field tells what the numbers are."""

    type: ClassVar[str] = "other_start"
    sent: str

    @property
    def token_numbers(self) -> TokenNumbers:
        return TokenNumbers(self.sent, f"{self.sent}, as the other source says")


def _shows(view) -> str | None:
    """Which single distribution the view's text and chart say they show (None: the raw and processed pair)."""
    caption, legend = view.token_view.caption.text(), view.chart.legend.text()
    if view.token_view.mode.isVisibleTo(view):
        assert "raw model" in legend and "after processors" in legend and "server" not in caption
        return None
    assert "the server's probability" in caption and "the server's probability" in legend
    return caption.partition("the server's probability (")[2].partition("): ")[0]


def _run(*events) -> Run:
    run = Run(index=0, settings=RunSettings())
    for event in events:
        run.apply(event)
    return run


def test_the_view_reads_the_start_events_fields(qtbot):
    from playground.ui.views.tokens import TokensView

    view = TokensView()
    qtbot.addWidget(view)
    view.show()
    step = no_probs_step(0, " Paris")
    local = _run(_started())
    view.apply(local, [_started()])
    assert _shows(view) is None
    served = _run(_started(), _remote("post-sampler", "after llama-server's sampler chain"), step)
    view.apply(served, served.events)  # live: the server's start follows the run's own
    assert _shows(view) == "post-sampler" and "after llama-server's sampler chain" in view.token_view.remote_note
    view.apply(local, [_started()])  # the next run is decoded here: back to the pair
    assert _shows(view) is None
    other = _run(_started(), OtherSourceStarted("raw (assumed)"), step)
    view.apply(other, other.events)
    assert _shows(view) == "raw (assumed)"
    for run, expected in ((served, "post-sampler"), (local, None), (other, "raw (assumed)")):
        view.show_run(run)  # a saved run, drawn at once
        assert _shows(view) == expected
