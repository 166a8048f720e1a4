"""The background job: ordered batches, failures as messages, stop, and always a finished signal."""

from __future__ import annotations

import time

from playground.config import ConfigError, RunSettings
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, RunStarted, TokenStep
from playground.ui.worker import GeneratorJob, describe_error


def _collect(job: GeneratorJob) -> dict:
    seen: dict = {"items": [], "batches": 0, "failed": [], "progress": [], "finished": 0}

    def on_items(batch):
        seen["items"].extend(batch)
        seen["batches"] += 1

    job.items.connect(on_items)
    job.failed.connect(seen["failed"].append)
    job.progress.connect(lambda m, f: seen["progress"].append((m, f)))
    job.finished.connect(lambda: seen.__setitem__("finished", seen["finished"] + 1))
    return seen


def test_items_arrive_in_order_in_batches(qtbot):
    def body(should_stop, progress):
        progress("counting", 0.5)
        yield from range(200)

    job = GeneratorJob(body)
    seen = _collect(job)
    with qtbot.waitSignal(job.finished, timeout=5000):
        job.start()
    assert seen["items"] == list(range(200))
    assert seen["batches"] < 200  # drained per frame, not per item
    assert seen["progress"] == [("counting", 0.5)]
    assert seen["failed"] == [] and seen["finished"] == 1 and not job.is_running()
    assert job.thread.isFinished()


def test_a_failure_becomes_a_message_and_finished_still_comes(qtbot):
    def body(should_stop, progress):
        yield 1
        raise ConfigError("top_p must be in (0, 1]")

    job = GeneratorJob(body)
    seen = _collect(job)
    with qtbot.waitSignal(job.finished, timeout=5000):
        job.start()
    assert seen["items"] == [1]
    assert seen["failed"] == ["top_p must be in (0, 1]"] and seen["finished"] == 1


def test_stop_ends_the_engine_run_with_its_final_event(qtbot, tiny_lm):
    settings = RunSettings(strategy="sample", max_new_tokens=200, prompt="Hello")
    job = GeneratorJob(lambda should_stop, progress: run_strategy(tiny_lm, settings, should_stop))
    seen = _collect(job)
    job.start()
    qtbot.waitUntil(lambda: sum(isinstance(e, TokenStep) for e in seen["items"]) >= 3, timeout=10000)
    job.stop()
    qtbot.waitUntil(lambda: seen["finished"] == 1, timeout=10000)
    assert isinstance(seen["items"][0], RunStarted)
    final = seen["items"][-1]
    assert isinstance(final, RunFinished) and final.stop_reason == "stopped"
    assert len(final.token_ids) < 200


def test_stop_closes_a_generator_that_ignores_it(qtbot, monkeypatch):
    """The safety net: a job still yielding ``STOP_DEADLINE_S`` after Stop is closed, and says so."""
    import playground.ui.worker as worker

    monkeypatch.setattr(worker, "STOP_DEADLINE_S", 0.3)
    closed = []

    def body(should_stop, progress):
        try:
            while True:
                time.sleep(0.002)
                yield 0
        finally:
            closed.append(True)

    job = GeneratorJob(body)
    seen = _collect(job)
    job.start()
    qtbot.waitUntil(lambda: len(seen["items"]) > 0, timeout=5000)
    job.stop()
    assert job.wait(5000)
    assert closed == [True] and seen["finished"] == 1
    assert len(seen["failed"]) == 1 and "did not end within 0.3 s of Stop" in seen["failed"][0]


def test_after_stop_a_job_runs_to_its_own_end_however_many_items_it_yields(qtbot):
    """Stop is the job's to honour: one that polls it and then yields many items (a speculative round of k
    tokens, two panes side by side) and its final item is not cut off after a fixed number of items."""
    def body(should_stop, progress):
        for i in range(10_000):
            if should_stop():
                yield from ("step", "step", "step", "step", "step", "final")  # the step in flight, then the end
                return
            time.sleep(0.001)
            yield i

    job = GeneratorJob(body)
    seen = _collect(job)
    job.start()
    qtbot.waitUntil(lambda: len(seen["items"]) > 3, timeout=5000)
    job.stop()
    qtbot.waitUntil(lambda: seen["finished"] == 1, timeout=5000)
    assert seen["items"][-6:] == ["step"] * 5 + ["final"] and seen["failed"] == []


def test_error_messages_say_what_happened():
    assert describe_error(ConfigError("shorten the prompt")) == "shorten the prompt"
    assert describe_error(RuntimeError("kaput")) == "RuntimeError: kaput"
    assert "out of memory" in describe_error(MemoryError())


def test_garbage_made_before_a_job_is_collected_on_the_gui_thread_not_the_worker(qtbot):
    """A worker that allocates must not run the cyclic collector: freeing Qt objects there deadlocked the test
    suite (see ``playground.ui.gui_gc``). Garbage in a cycle is freed later, on the GUI thread's timer."""
    import gc
    import threading

    freed_on: list[str] = []

    class Cycle:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            freed_on.append(threading.current_thread().name)

    def body(should_stop, progress):
        junk = [[i] for i in range(200_000)]  # crosses every collection threshold many times over
        yield len(junk)

    gc.collect()
    job = GeneratorJob(body)
    job.start()  # the GUI-thread collector is installed here, before the worker runs
    for _ in range(gc.get_threshold()[0] + 100):  # unreachable now, only a collection frees them; enough of them
        Cycle()  # to cross the youngest generation's threshold
    assert not gc.isenabled()  # while the job runs, only the GUI thread's timer collects
    with qtbot.waitSignal(job.finished, timeout=10_000):
        pass
    assert gc.isenabled()  # no job left: Python's usual collector is back
    qtbot.waitUntil(lambda: freed_on != [], timeout=5000)  # the GUI timer collects them, not the worker
    assert set(freed_on) == {threading.main_thread().name}
