"""A remote run against a local HTTP server that misbehaves on purpose: every failure ends the run with a message
that says what to do, within the timeout, keeping what was streamed; Stop returns at once even from a silent server.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from playground.config import ConfigError, RunSettings
from playground.events import PrefillDone, RunFinished, RunStarted, dumps_event, event_from_dict
from playground.events.remote import RemoteStarted, RemoteTokenStep
from playground.remote.decode import run_remote
from playground.remote.errors import RemoteError
from playground.remote.source import RemoteSource

KEY = "sk-test-secret-0123456789"
TOKENS = [(" Paris", -0.25), (" is", -0.5), (" nice", -1.0), (".", -0.125), (" Yes", -2.0), ("!", -0.75)]


def chunk(text: str, logprob: float | None, finish: str | None = None) -> bytes:
    choice: dict = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    if logprob is not None:
        choice["logprobs"] = {"content": [{"token": text, "logprob": logprob, "bytes": list(text.encode()),
                                           "top_logprobs": [{"token": text, "logprob": logprob},
                                                            {"token": " other", "logprob": -3.0}]}]}
    return b"data: " + json.dumps({"object": "chat.completion.chunk", "choices": [choice]}).encode() + b"\n\n"


class Misbehaving(BaseHTTPRequestHandler):
    """An OpenAI-compatible server whose ``mode`` says how it fails."""

    mode = "ok"
    release = threading.Event()  # set at teardown: a stalled handler stops waiting
    token_gap_s = 0.0
    finish_reason = "length"  # the finish reason of a stream that ends well
    seen_auth: ClassVar[list[str]] = []

    def log_message(self, *args) -> None:  # keep the test output clean
        pass

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.seen_auth.append(self.headers.get("Authorization", ""))
        if self.mode == "404":
            self._json(404, {"error": {"message": "File Not Found"}})
        elif self.mode == "401":
            # A careless server that echoes what it was sent: the key must still never reach the message.
            self._json(401, {"error": {"message": f"Invalid API key: {self.headers.get('Authorization')}"}})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not here"}})

    def do_POST(self) -> None:
        self.seen_auth.append(self.headers.get("Authorization", ""))
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.mode == "500":
            self._json(500, {"error": {"message": "boom: out of KV slots"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(chunk("", None).replace(b'"content": ""', b'"role": "assistant", "content": null'))
        for i, (text, logprob) in enumerate(TOKENS):
            if i == 2 and self.mode in ("stall", "malformed", "truncated", "cut", "error-event"):
                if self.mode == "stall":
                    self.release.wait(30)
                elif self.mode == "malformed":
                    self.wfile.write(b"data: {this is not json\n\n")
                elif self.mode == "error-event":  # llama-server's way to fail mid-stream
                    self.wfile.write(b'data: {"error": {"code": 500, "message": "the KV cache is full", '
                                     b'"type": "server_error"}}\n\n')
                elif self.mode == "cut":
                    self.wfile.write(b'data: {"choices": [{"ind')
                return  # truncated: close the stream without finishing it
            self.wfile.write(chunk(text, None if self.mode == "no-logprobs" else logprob))
            self.wfile.flush()
            time.sleep(self.token_gap_s)
        self.wfile.write(chunk("", None, finish=self.finish_reason))
        self.wfile.write(b"data: [DONE]\n\n")


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # a client that hangs up on purpose is no news
        pass


@pytest.fixture
def server():
    Misbehaving.release.clear()
    Misbehaving.seen_auth = []
    Misbehaving.finish_reason = "length"
    httpd = QuietServer(("127.0.0.1", 0), Misbehaving)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()

    def use(mode: str, gap_s: float = 0.0) -> RemoteSource:
        Misbehaving.mode, Misbehaving.token_gap_s = mode, gap_s
        return RemoteSource(base_url=f"http://127.0.0.1:{httpd.server_address[1]}/v1", timeout_s=1.0)

    yield use
    Misbehaving.release.set()
    httpd.shutdown()
    httpd.server_close()


SETTINGS = RunSettings(max_new_tokens=len(TOKENS), num_candidates=2)


def run_until_error(source: RemoteSource, settings: RunSettings = SETTINGS) -> tuple[list, RemoteError, float]:
    events: list = []
    start = time.perf_counter()
    with pytest.raises(RemoteError) as error:
        for event in run_remote(source, settings):
            events.append(event)
    return events, error.value, time.perf_counter() - start


def tokens(events: list) -> list[RemoteTokenStep]:
    return [e for e in events if isinstance(e, RemoteTokenStep)]


def test_a_good_stream_gives_the_runs_events(server):
    events = list(run_remote(server("ok"), SETTINGS))
    assert [type(e) for e in events[:3]] == [RunStarted, RemoteStarted, PrefillDone]
    assert isinstance(events[-1], RunFinished) and len(tokens(events)) == len(TOKENS)
    started, remote, done = events[0], events[1], events[-1]
    assert (remote.engine, remote.distribution, remote.model) == ("generic", "unknown", "fake-model")
    assert started.device == "remote: generic" and started.model_name == "fake-model"
    assert [t.text for t in tokens(events)] == [text for text, _ in TOKENS]
    assert [t.prob for t in tokens(events)] == [math.exp(lp) for _, lp in TOKENS]
    assert done.text == "".join(text for text, _ in TOKENS) and done.stop_reason == "max_new_tokens"
    assert Misbehaving.seen_auth[-1] == ""  # no key named: no Authorization header at all


def test_a_server_run_says_so_in_its_start_event_and_in_its_saved_trace(server):
    events = list(run_remote(server("ok"), SETTINGS))
    assert events[0].remote is True
    assert event_from_dict(json.loads(dumps_event(events[0]))).remote is True


@pytest.mark.parametrize(("finish", "reason"), [("stop", "eos"), ("content_filter", "content_filter"),
                                                ("tool_calls", "tool_calls"), ("abort", "unknown")])
def test_a_servers_finish_reason_becomes_a_stop_reason(server, finish, reason):
    """The API's own finish reasons are kept; one an engine made up is "unknown" (a StopReason all the same)."""
    Misbehaving.finish_reason = finish
    done = list(run_remote(server("ok"), SETTINGS.replace(max_new_tokens=len(TOKENS) + 1)))[-1]
    assert isinstance(done, RunFinished) and done.stop_reason == reason


def test_stop_strings_are_watched_here_and_end_the_stream(server):
    events = list(run_remote(server("ok"), SETTINGS.replace(stop_strings=("nice",))))
    assert [t.text for t in tokens(events)] == [" Paris", " is", " nice"]
    assert events[-1].stop_reason == "stop_string"


def test_connection_refused(server):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    events, error, _ = run_until_error(RemoteSource(base_url=f"http://127.0.0.1:{port}/v1", timeout_s=1.0))
    assert events == [] and f"127.0.0.1:{port} refused the connection" in str(error)


def test_https_to_a_plain_http_server(server):
    plain = server("ok")
    events, error, _ = run_until_error(plain.replace(base_url=plain.base_url.replace("http://", "https://")))
    assert events == [] and "TLS handshake with 127.0.0.1" in str(error) and "http://" in str(error)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_a_certificate_that_cannot_be_verified_is_refused(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    httpd = QuietServer(("127.0.0.1", 0), Misbehaving)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    Misbehaving.mode = "ok"
    try:
        events, error, _ = run_until_error(RemoteSource(base_url=f"https://127.0.0.1:{httpd.server_address[1]}/v1",
                                                        timeout_s=2.0))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert events == [] and "TLS certificate of 127.0.0.1" in str(error) and "could not be verified" in str(error)


def test_wrong_url_404(server):
    events, error, _ = run_until_error(server("404"))
    assert events == [] and "was not found (HTTP 404" in str(error) and "/v1" in str(error)


def test_401_names_the_variable_never_the_key(server, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_TEST_KEY", KEY)
    source = server("401").replace(api_key_env="PLAYGROUND_TEST_KEY")
    events, error, _ = run_until_error(source)
    assert events == []
    assert Misbehaving.seen_auth[0] == f"Bearer {KEY}"  # the key was sent, and echoed back by the server
    assert "PLAYGROUND_TEST_KEY" in str(error) and "HTTP 401" in str(error)
    assert KEY not in str(error) and KEY not in repr(error)


def test_the_key_is_in_no_event(server, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_TEST_KEY", KEY)
    events = list(run_remote(server("ok").replace(api_key_env="PLAYGROUND_TEST_KEY"), SETTINGS))
    assert Misbehaving.seen_auth[-1] == f"Bearer {KEY}"
    assert all(KEY not in dumps_event(e) for e in events)
    assert events[1].api_key_env == "PLAYGROUND_TEST_KEY"


def test_a_missing_key_variable_is_a_settings_error_before_any_event(server, monkeypatch):
    monkeypatch.delenv("PLAYGROUND_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="PLAYGROUND_TEST_KEY"):
        run_remote(server("ok").replace(api_key_env="PLAYGROUND_TEST_KEY"), SETTINGS)


def test_server_error_500(server):
    events, error, _ = run_until_error(server("500"))
    assert "the server failed (HTTP 500: boom: out of KV slots)" in str(error)
    assert [type(e) for e in events] == [RunStarted, RemoteStarted]  # the run's start is kept


def test_a_stalled_server_ends_the_run_within_the_timeout(server):
    events, error, elapsed = run_until_error(server("stall"))
    assert "sent nothing for 1 s" in str(error) and "after 2 tokens" in str(error)
    assert len(tokens(events)) == 2  # what came before the stall is kept
    assert elapsed < 4.0


def test_a_malformed_stream(server):
    events, error, _ = run_until_error(server("malformed"))
    assert "malformed stream after 2 tokens" in str(error) and "not JSON" in str(error)
    assert len(tokens(events)) == 2


@pytest.mark.parametrize("mode", ["truncated", "cut"])
def test_a_truncated_stream(server, mode):
    events, error, elapsed = run_until_error(server(mode))
    assert len(tokens(events)) == 2 and elapsed < 4.0
    # "cut" stops in the middle of an event: an SSE event without its closing blank line is dropped, as the
    # protocol says, so both read as a stream that ended early.
    assert "ended before the server said it was done (after 2 tokens)" in str(error)


def test_an_error_event_mid_stream(server):
    events, error, _ = run_until_error(server("error-event"))
    assert "the server reported an error while streaming the run after 2 tokens: the KV cache is full" in str(error)
    assert len(tokens(events)) == 2


def test_a_server_that_sends_no_logprobs(server):
    events, error, _ = run_until_error(server("no-logprobs"))
    assert "without log-probabilities" in str(error) and tokens(events) == []


@pytest.mark.parametrize("mode", ["ok", "stall"])
def test_stop_mid_stream_returns_promptly(server, mode):
    # "ok" streams a token every 0.3 s; "stall" goes silent after two tokens (timeout 30 s): Stop must not wait.
    source = server(mode, gap_s=0.3).replace(timeout_s=30.0)
    seen: list = []
    stop_at = None

    def should_stop() -> bool:
        return len(tokens(seen)) >= 2

    for event in run_remote(source, SETTINGS, should_stop):
        seen.append(event)
        if stop_at is None and should_stop():
            stop_at = time.perf_counter()
    waited = time.perf_counter() - stop_at
    assert seen[-1].stop_reason == "stopped" and len(tokens(seen)) == 2
    assert waited < 0.5, f"Stop took {waited:.2f} s"


def test_cli_trace_streams_json_lines_without_torch(server):
    source = server("ok")
    code = ("import sys; from playground.cli import main; rc = main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'a remote trace imported torch'; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code, "trace", "--base-url", source.base_url, "--prompt", "Hi",
                             "--max-new-tokens", "3"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert result.returncode == 0, result.stderr
    kinds = [json.loads(line)["type"] for line in result.stdout.splitlines()]
    assert kinds == ["start", "remote_start", "prefill", "remote_token", "remote_token", "remote_token", "done"]


def test_cli_refuses_a_server_and_a_local_model_together(server, capsys):
    from playground.cli import main

    assert main(["trace", "--base-url", server("ok").base_url, "--model", "x", "--prompt", "Hi"]) == 2
    assert "--base-url and --model are mutually exclusive" in capsys.readouterr().err


def test_strategies_that_need_the_model_are_refused(server):
    with pytest.raises(ConfigError, match="needs a local model"):
        run_remote(server("ok"), RunSettings.from_flat(strategy="beam", num_beams=2))
    with pytest.raises(ConfigError, match="needs a local model"):
        run_remote(server("ok"), RunSettings(no_repeat_ngram_size=2))


def test_a_remote_run_needs_neither_torch_nor_qt():
    code = ("import sys; import playground.remote.decode, playground.remote.client; "
            "assert not {'torch', 'PySide6'} & set(sys.modules), sorted({'torch', 'PySide6'} & set(sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert result.returncode == 0, result.stderr
