"""The window with a model on a server: the real llama-server (serving the default model's own GGUF) driven through
the "Server…" dialog, Generate, Stop, branching and a server killed mid-stream; a local socket that misbehaves on
purpose where a real server cannot (pytest-qt, offscreen).

References are the server's own answers, fetched here with plain HTTP (``urllib``), not through the runner.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from llama_server import start_server
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor
from test_remote_failures import Misbehaving, QuietServer
from windows import let_go, open_window, top_level_ids, windows_opened_since

from playground.config import RunSettings
from playground.events.remote import RemoteTokenStep
from playground.remote.source import RemoteSource
from playground.state import flowing_token_text
from playground.ui.main_window import MainWindow
from playground.ui.style import shade_for_prob
from playground.ui.views.tokens.tooltip import NO_PROBS_BG, token_tooltip_html

pytestmark = pytest.mark.model
RUN_TIMEOUT_MS = 30000


# --- helpers ---------------------------------------------------------------------------------------------------------
def served_models(root: str) -> list[str]:
    with urllib.request.urlopen(root + "/v1/models", timeout=10) as response:
        return [m["id"] for m in json.load(response)["data"]]


def greedy_completion(root: str, prompt: str, n: int, top: int = 5) -> list[dict]:
    """The server's greedy answer to a plain prompt, token by token with its top candidates (not streamed)."""
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": top}).encode()
    request = urllib.request.Request(root + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["choices"][0]["logprobs"]["content"]


def tokens(w: MainWindow):
    return w.views["tokens"]


def showing(w: MainWindow, name: str) -> bool:
    return w.docks[name].pages.currentWidget() is w.views[name]


def connect(qtbot, w: MainWindow, url: str) -> None:
    w.connect_server(RemoteSource(base_url=url + "/v1"))
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    assert w.remote is not None, w.banner.label.text()


def set_form(w: MainWindow, prompt: str, max_new_tokens: int, chat: bool = False, candidates: int = 5) -> None:
    w.prompt.setPlainText(prompt)
    w.controls.widgets["chat"].setChecked(chat)
    w.controls.widgets["max_new_tokens"].setValue(max_new_tokens)
    w.controls.widgets["num_candidates"].setValue(candidates)


def generate(qtbot, w: MainWindow) -> None:
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)


@pytest.fixture
def window(qtbot, tmp_path):
    w = open_window(qtbot, tmp_path, run_settings=RunSettings(max_new_tokens=8))
    yield w
    let_go(w, 5000)


# --- the tests -------------------------------------------------------------------------------------------------------
def test_the_dialog_tests_the_connection_and_connects(qtbot, window, llama_server_url):
    w = window
    qtbot.mouseClick(w.picker.open_server, Qt.MouseButton.LeftButton)
    dialog = w.picker.server_dialog
    assert dialog is not None and dialog.isVisible()

    dialog.base_url.setText("127.0.0.1:8080/v1")  # no scheme: refused at once, no request
    qtbot.mouseClick(dialog.test_button, Qt.MouseButton.LeftButton)
    assert "must start with http://" in dialog.result.text() and not w.busy

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    dialog.base_url.setText(f"http://127.0.0.1:{closed}/v1")
    qtbot.mouseClick(dialog.test_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "Error" in dialog.result.text(), timeout=RUN_TIMEOUT_MS)
    assert f"127.0.0.1:{closed} refused the connection" in dialog.result.text()
    assert dialog.test_button.isEnabled() and w.remote is None

    dialog.base_url.setText(llama_server_url + "/v1")
    qtbot.mouseClick(dialog.test_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.models.count() > 0, timeout=RUN_TIMEOUT_MS)
    expected = served_models(llama_server_url)
    assert [dialog.models.item(i).text() for i in range(dialog.models.count())] == expected
    assert "llama.cpp" in dialog.result.text() and "Connected" in dialog.result.text()
    assert w.remote is None  # a test uses nothing yet

    qtbot.mouseClick(dialog.connect_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.remote is not None, timeout=RUN_TIMEOUT_MS)
    from playground.models.default_model import ensure_default_gguf

    name = Path(ensure_default_gguf()).name
    assert w.picker.loaded.text() == f"Server: <b>llama.cpp · {name}</b> at {llama_server_url}/v1"
    assert w.lm is None and w.generate_button.isEnabled() and not dialog.isVisible()
    assert "server: llama.cpp" in " ".join(label.text() for label in w.status.labels.values())


def test_generate_streams_the_servers_tokens_with_probability_bars(qtbot, window, llama_server_url):
    w = window
    connect(qtbot, w, llama_server_url)
    prompt = "The capital of France is"
    set_form(w, prompt, 8)
    generate(qtbot, w)

    run = w.session.runs[0]
    assert run.error is None and run.finished is not None, run.error
    reference = greedy_completion(llama_server_url, prompt, 8)
    steps = tokens(w).token_view.steps
    assert steps == run.steps and all(isinstance(s, RemoteTokenStep) for s in steps)
    assert [s.text for s in steps] == [r["token"] for r in reference]
    assert [s.token_id for s in steps] == [r["id"] for r in reference]
    for step, ref in zip(steps, reference, strict=True):
        # (llama.cpp's numbers move in the third decimal with how the prompt was batched and cached)
        assert step.prob == pytest.approx(math.exp(ref["logprob"]), abs=0.02)
        assert [c.token_id for c in step.candidates][:2] == [t["id"] for t in ref["top_logprobs"]][:2]
    doc = tokens(w).token_view.text
    assert doc.toPlainText() == prompt + "".join(flowing_token_text(s.text) for s in steps)
    for i, step in enumerate(steps):  # each token shaded by the server's probability
        cursor = QTextCursor(doc.document())
        cursor.setPosition(doc._starts[i] + 1)
        assert cursor.charFormat().background().color() == shade_for_prob(step.prob)

    chart = tokens(w).chart
    shown = chart.step
    widths = list(chart._raw.opts["width"])
    candidates = sorted(shown.candidates, key=lambda c: c.raw_rank)
    assert np.allclose(widths[:-1], [c.raw_prob * 100 for c in candidates])
    assert np.isclose(widths[-1], (1 - sum(c.raw_prob for c in candidates)) * 100)  # the rest of the vocabulary
    assert not any(chart._processed.opts["width"])  # one number per token: one bar per row
    assert "the server's probability (raw)" in chart.legend.text()
    assert f"rank {shown.raw_rank}" in chart.header.text()
    status = " ".join(label.text() for label in w.status.labels.values() if label.isVisible())
    assert "probabilities: raw, from llama.cpp" in status and "server: llama.cpp" in status
    assert "llama-server's softmax" in w.status.labels["numbers"].toolTip()
    # llama-server's slot: the 5 prompt tokens and those generated, the last not yet in the cache
    assert f"KV {5 + len(reference) - 1}/4096 tokens" in status


def test_a_token_without_probabilities_is_drawn_neutral(qtbot, window):
    # llama-server with a draft model sends accepted draft tokens so; built here as the stream gives them.
    from playground.remote.stream import no_probs_step

    w = window
    view = tokens(w)
    blind = no_probs_step(0, " Paris", token_id=7042)
    view.token_view.append_steps([blind])
    cursor = QTextCursor(view.token_view.text.document())
    cursor.setPosition(1)
    assert cursor.charFormat().background().color().name().upper() == NO_PROBS_BG
    assert "no probabilities from the server" in token_tooltip_html(blind)
    view.chart.show_step(blind, 1)
    assert "no probabilities from the server" in view.chart.header.text() and view.chart.rows == []
    assert not list(view.chart._raw.opts["width"])


def test_stop_mid_run_ends_it_promptly(qtbot, window, llama_server_url):
    w = window
    connect(qtbot, w, llama_server_url)
    set_form(w, "Count from 1 to 500: 1, 2, 3,", 1500)
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(w.session.runs[0].steps) >= 3, timeout=RUN_TIMEOUT_MS)
    start = time.perf_counter()
    qtbot.mouseClick(w.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=5000)
    waited = time.perf_counter() - start
    run = w.session.runs[0]
    assert run.finished is not None and run.finished.stop_reason == "stopped"
    assert len(run.steps) < 1500 and waited < 1.0, f"Stop took {waited:.2f} s"
    assert w.generate_button.isEnabled() and not w.stop_button.isEnabled()


def test_a_strategy_that_needs_the_model_is_refused_with_the_runners_message(qtbot, window, llama_server_url):
    w = window
    connect(qtbot, w, llama_server_url)
    w.controls.strategy.setCurrentText("beam")
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    assert w.banner.isVisible() and w.banner.kind == "error"
    assert "the beam strategy needs a local model" in w.banner.label.text()
    assert w.session.runs == [] and not w.busy and w.generate_button.isEnabled()


def test_views_that_need_the_models_insides_say_so(qtbot, window, llama_server_url):
    w = window
    connect(qtbot, w, llama_server_url)
    set_form(w, "One, two,", 3)
    generate(qtbot, w)
    run = w.session.runs[0]
    assert run.finished is not None and showing(w, "tokens")
    for name, title in (("beam", "Beam tree"), ("layers", "Layers"), ("quant", "Quantization")):
        assert not showing(w, name)
        text = w.docks[name].empty.text()
        assert text.startswith(f"{title} needs a local model: run #1 was decoded by llama.cpp at a server, which "
                               "does not expose the model's insides (")
    # The KV view still says what the server tells of its cache: its slot's tokens, read here independently.
    import json
    import urllib.request

    with urllib.request.urlopen(llama_server_url + "/slots", timeout=5) as response:
        slots = json.load(response)
    slot = max((s for s in slots if isinstance(s.get("id_task"), int)), key=lambda s: s["id_task"])
    kv_text = w.docks["kv"].empty.text()
    assert kv_text.startswith(f"The server's KV cache after run #1: {slot['n_prompt_tokens']} of the "
                              f"{slot['n_ctx']} tokens its slot holds")
    assert "KV cache needs a local model" in kv_text


def test_branching_continues_with_the_alternatives_text(qtbot, window, llama_server_url):
    w = window
    connect(qtbot, w, llama_server_url)
    prompt = "The capital of France is"
    set_form(w, prompt, 6)
    generate(qtbot, w)
    parent = w.session.runs[0]
    alternative = next(c for c in parent.steps[2].candidates if c.token_id != parent.steps[2].token_id)

    view = tokens(w)
    view.show_chart_step(2)
    row = next(i for i, r in enumerate(view.chart.rows) if r.token_id == alternative.token_id)
    view.chart.request_branch(row)  # what a double-click on that bar does
    qtbot.waitUntil(lambda: len(w.session.runs) == 2 and not w.busy, timeout=RUN_TIMEOUT_MS)

    child = w.session.runs[1]
    assert child.error is None and child.finished is not None, child.error
    assert child.branch is not None and (child.branch.parent, child.branch.step) == (0, 2)
    assert [s.text for s in child.steps[:2]] == [s.text for s in parent.steps[:2]]
    assert child.steps[2].text == alternative.text and child.steps[2].token_id == alternative.token_id
    assert [s.forced for s in child.steps[:3]] == [True, True, True] and not any(s.forced for s in child.steps[3:])
    # The server's own greedy continuation of the prompt plus the sent text.
    sent = "".join(s.text for s in parent.steps[:2]) + alternative.text
    reference = greedy_completion(llama_server_url, prompt + sent, 6 - 3)
    assert [s.text for s in child.steps[3:]] == [r["token"] for r in reference]
    assert "branch of #1 at step 2" in w.runs_list.item(1).text()


def test_a_server_killed_mid_stream_keeps_the_run(qtbot, window, llama_server_url, tmp_path):
    from playground.traces import read_trace

    w = window
    server, url = start_server()
    try:
        w.connect_server(RemoteSource(base_url=url + "/v1", timeout_s=5.0))
        qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
        set_form(w, "Count from 1 to 500: 1, 2, 3,", 1500)
        qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: len(w.session.runs[0].steps) >= 3, timeout=RUN_TIMEOUT_MS)
        server.kill()
        qtbot.waitUntil(lambda: not w.busy, timeout=15000)
    finally:
        server.kill()
        server.wait(timeout=10)
    run = w.session.runs[0]
    assert run.error is not None and ("cut" in run.error or "ended before" in run.error), run.error
    assert len(run.steps) >= 3 and run.status == "failed"
    assert "failed" in w.runs_list.item(0).text() and w.banner.kind == "error"
    saved = read_trace(w.save_run(tmp_path / "cut.jsonl"))  # what was streamed can be saved
    assert [e.text for e in saved.events if isinstance(e, RemoteTokenStep)] == [s.text for s in run.steps]

    connect(qtbot, w, llama_server_url)  # and the window goes on
    set_form(w, "One, two,", 2)
    generate(qtbot, w)
    assert w.session.runs[1].finished is not None and w.session.runs[1].error is None


@pytest.fixture
def stalling_server():
    """The misbehaving local server in its "stall" mode: two tokens, then silence."""
    Misbehaving.release.clear()
    Misbehaving.mode, Misbehaving.token_gap_s = "stall", 0.0
    httpd = QuietServer(("127.0.0.1", 0), Misbehaving)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    Misbehaving.release.set()
    httpd.shutdown()
    httpd.server_close()


def test_stop_and_close_are_prompt_while_the_server_is_silent(qtbot, window, stalling_server):
    w = window
    w.connect_server(RemoteSource(base_url=stalling_server, timeout_s=60.0))
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    assert w.remote is not None and "generic" in w.picker.loaded.text()
    set_form(w, "Hi", 6, candidates=2)
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(w.session.runs[0].steps) == 2, timeout=RUN_TIMEOUT_MS)
    start = time.perf_counter()
    w.stop()
    qtbot.waitUntil(lambda: not w.busy, timeout=5000)
    assert time.perf_counter() - start < 1.0
    assert w.session.runs[0].finished.stop_reason == "stopped"

    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)  # silent again: close the window now
    qtbot.waitUntil(lambda: len(w.session.runs) == 2 and len(w.session.runs[1].steps) == 2, timeout=RUN_TIMEOUT_MS)
    job = w.job
    start = time.perf_counter()
    w.close()
    assert time.perf_counter() - start < 1.0 and w.job is None
    assert job is not None and job.wait(2000)  # its thread ended too: no socket left waiting 60 s


def test_shot_and_app_start_with_the_server(qtbot, qapp, llama_server_url, tmp_path, capsys, monkeypatch):
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtGui import QImage

    from playground.cli import main

    out = tmp_path / "remote.png"
    assert main(["shot", "--base-url", llama_server_url + "/v1", "--prompt", "One, two,", "--no-chat",
                 "--max-new-tokens", "3", "--out", str(out)]) == 0, capsys.readouterr().err
    image = QImage(str(out))
    assert (image.width(), image.height()) == (1500, 950)
    assert len({image.pixel(x, y) for x in range(0, 1500, 50) for y in range(0, 950, 50)}) > 10  # not blank
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    assert main(["shot", "--base-url", f"http://127.0.0.1:{closed}/v1", "--out", str(tmp_path / "x.png")]) == 2
    assert "refused the connection" in capsys.readouterr().err

    # The app: the window connects to the server instead of loading a model.
    loop = QEventLoop()
    monkeypatch.setattr(qapp, "exec", loop.exec, raising=False)  # a real exec() would end the shared app
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    seen = {}

    def check_then_quit() -> None:
        windows = windows_opened_since(before)
        if windows and windows[-1].remote is not None and not windows[-1].busy:
            seen["picker"], seen["lm"] = windows[-1].picker.loaded.text(), windows[-1].lm
            windows[-1].close()
            loop.quit()
        else:
            QTimer.singleShot(50, check_then_quit)

    before = top_level_ids()  # the window the launch opens is none of these
    QTimer.singleShot(50, check_then_quit)
    QTimer.singleShot(20000, loop.quit)  # a safety net: never hang the suite
    assert main(["app", "--base-url", llama_server_url + "/v1"]) == 0
    assert seen["picker"].startswith("Server: <b>llama.cpp · ") and seen["lm"] is None
