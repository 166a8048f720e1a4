"""A run streamed from a server: the same events a local greedy/sampling run yields, fed by the server's stream.

``run_remote(source, settings, should_stop)`` checks everything it can before the first event (``ConfigError``),
then returns a generator: ``RunStarted``, ``RemoteStarted``, ``PrefillDone``, one ``RemoteTokenStep`` per token,
``RunFinished``. Every server failure raises ``RemoteError`` with a message that says what to do; the events
already yielded stay with the consumer (nothing of the run so far is lost).

The stream is read on a helper thread that hands chunks over a queue, so Stop is honoured within ``POLL_S`` even
while the server is silent (a long prompt, a stall), and closing shuts the socket down at once. No torch here.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from playground.config import ConfigError, RunSettings
from playground.config.catalog import StopCheck
from playground.config.samplers import SAMPLER_GROUPS
from playground.config.stop_strings import StopStringWatch
from playground.events import STOP_REASONS, Event, PrefillDone, RunFinished, RunStarted, StopReason
from playground.events.remote import RemoteStarted, RemoteTokenStep
from playground.remote.branch import RemoteBranch
from playground.remote.client import (
    CONNECT_TIMEOUT_S,
    EngineInfo,
    describe_failure,
    detect_engine,
    get_json,
    get_text,
    open_client,
    open_http,
    parse_metrics,
    request_headers,
)
from playground.remote.constraint import constraint_of, reply_note
from playground.remote.errors import RemoteError
from playground.remote.request import build_request, distribution_of, missing_of
from playground.remote.source import RemoteSource
from playground.remote.stream import MalformedChunk, MissingLogprobs, StreamFormat, chunk_parts, chunk_steps

POLL_S = 0.05  # how often Stop is looked at while waiting for the server
REMOTE_STRATEGIES = ("greedy", "sample")
_CHUNK, _END, _ERROR = "chunk", "end", "error"


def _never() -> bool:
    return False


def check_remote_settings(settings: RunSettings, branch: RemoteBranch | None) -> None:
    """Refuse, before any request, what a server cannot do."""
    if settings.strategy not in REMOTE_STRATEGIES:
        raise ConfigError(f"the {settings.strategy} strategy needs a local model: it reads the model's own logits, "
                          "which a server does not send (a server streams each chosen token with its top "
                          "candidates). Use greedy or sample with a server")
    if settings.no_repeat_ngram_size > 0:
        raise ConfigError("no-repeat n-gram needs a local model: servers do not offer it (set it to 0)")
    local_only = [g for g in settings.groups if type(g) not in SAMPLER_GROUPS]  # a sampler's: the request decides
    if local_only:
        titles = ", ".join(g.title or g.name for g in local_only)
        raise ConfigError(f"{titles} needs a local model: a server streams only tokens and their top candidates")
    if branch is not None and constraint_of(settings) is not None:
        raise ConfigError("a remote branch under a constraint cannot be sent: the server would apply the constraint "
                          "to the continuation alone, not to the parent's text before it. Branch with the constraint "
                          "off (unconstrained), or run the constrained branch on a local model")
    if settings.forced_token_ids and branch is None:
        raise ConfigError("forced token ids cannot be sent to a server, which takes text: a remote branch passes "
                          "the parent run's steps and the picked alternative (RemoteBranch)")


def run_remote(source: RemoteSource, settings: RunSettings, should_stop: StopCheck | None = None,
               branch: RemoteBranch | None = None) -> Generator[Event, None, None]:
    """Stream ``settings``' run from the server ``source`` names; ``branch``: continue a remote run from an
    alternative token (its text is sent, see ``playground.remote.branch``)."""
    source.validate()
    settings.validate()
    check_remote_settings(settings, branch)
    if branch is not None:
        branch.validate()
    source.api_key()  # a variable that is not set is a settings error: say so before any event
    return _run(source, settings, should_stop or _never, branch)


class _StreamReader:
    """Reads the server's stream on a daemon thread: (kind, payload, arrival time) items on a queue."""

    def __init__(self, open_stream: Callable[[], Any]) -> None:
        self.items: queue.SimpleQueue = queue.SimpleQueue()
        self._open = open_stream
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._stream: Any = None
        self._thread = threading.Thread(target=self._read, name="remote-stream", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        stream = None
        try:
            stream = self._open()
            with self._lock:
                self._stream = stream
            if self._closed.is_set():
                return
            for chunk in stream:
                plain = chunk.model_dump(warnings=False) if hasattr(chunk, "model_dump") else chunk
                self.items.put((_CHUNK, plain, time.perf_counter()))
                if self._closed.is_set():
                    return
            self.items.put((_END, None, time.perf_counter()))
        except BaseException as error:  # handed to the run, which says what it means
            if not self._closed.is_set():
                self.items.put((_ERROR, error, time.perf_counter()))
        finally:
            if stream is not None:
                stream.close()

    def next(self, should_stop: StopCheck, silence_s: float) -> tuple[str, Any, float] | None:
        """The next item, or None once ``should_stop`` says so; RemoteError-worthy TimeoutError after
        ``silence_s`` of nothing (a safety net: the HTTP read timeout normally fires first)."""
        waited = 0.0
        while True:
            try:
                return self.items.get(timeout=POLL_S)
            except queue.Empty:
                if should_stop():
                    return None
                waited += POLL_S
                if waited > silence_s:
                    raise TimeoutError("no data from the reader thread") from None

    def close(self) -> None:
        """Stop reading now: shut the socket down so a read blocked on a silent server returns at once."""
        self._closed.set()
        with self._lock:
            stream = self._stream
        if stream is None:
            return  # still connecting: the thread closes the stream as soon as it has one
        network = stream.response.extensions.get("network_stream")
        sock = network.get_extra_info("socket") if network is not None else None
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)


def _run(source: RemoteSource, settings: RunSettings, should_stop: StopCheck,
         branch: RemoteBranch | None) -> Generator[Event, None, None]:
    http = open_http(source)
    try:
        info = detect_engine(source, http, source.model)
        model = info.resolve_model(source.model)
        forced = branch.forced_steps() if branch is not None else []
        left = settings.max_new_tokens - len(forced)
        request = build_request(settings, info, model, source,
                                answer_start=branch.prefix_text() if branch is not None else "",
                                max_tokens=max(left, 1))
        before = _metrics(http, source, info)
        label, note = distribution_of(info, source)
        yield RunStarted(
            strategy=settings.strategy, prompt_text=settings.prompt, prompt_token_ids=(),
            forced_token_ids=tuple(s.token_id for s in forced), model_name=_short(model), model_path=source.api_url,
            device=f"remote: {info.engine}", dtype=info.ftype, settings=settings.as_plain_dict(), remote=True,
        )
        yield RemoteStarted(
            engine=info.engine, engine_version=info.version, base_url=source.api_url, model=model,
            endpoint=request.endpoint, distribution=label, distribution_note=note,
            top_logprobs=request.top_logprobs, timings="server" if info.engine == "llama.cpp" else "client",
            n_ctx=info.n_ctx, speculative=info.speculative, api_key_env=source.api_key_env,
            model_meta=dict(info.model_meta), missing=missing_of(info, source),
        )
        if left <= 0:  # the forced tokens fill the run: nothing to ask the server
            yield PrefillDone(prompt_tokens=0, prefill_ms=0.0, kv_cache_bytes=0)
            yield from forced
            yield _finished(forced, [], "max_new_tokens", {}, info, model, source, {})
            return
        yield from _stream(source, settings, should_stop, info, model, request, forced, http, before)
    finally:
        http.close()


def _short(model: str) -> str:
    """A model's name for labels: llama-server names its model by the GGUF's full path."""
    return model.rstrip("/").rsplit("/", 1)[-1] or model


def _metrics(http: Any, source: RemoteSource, info: EngineInfo) -> dict[str, float]:
    if not info.metrics:
        return {}
    text = get_text(http, source, "/metrics")
    return parse_metrics(text) if text else {}


def _stream(source: RemoteSource, settings: RunSettings, should_stop: StopCheck, info: EngineInfo, model: str,
            request: Any, forced: list[RemoteTokenStep], http: Any,
            before: dict[str, float]) -> Iterator[Event]:
    fmt = StreamFormat(engine=info.engine, top_logprobs=request.top_logprobs)
    client = open_client(source, http)
    routes: dict[str, Callable[..., Any]] = {"chat/completions": client.chat.completions.create,
                                             "completions": client.completions.create}
    create = routes[request.endpoint]
    started = time.perf_counter()
    reader = _StreamReader(lambda: create(**request.kwargs, extra_headers=request_headers(source)))
    stop_watch = StopStringWatch(settings.stop_strings)
    steps: list[RemoteTokenStep] = []
    timings: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    finish: str | None = None
    stop_reason: StopReason | None = None
    first_at = last_at = 0.0
    last_predicted_ms = 0.0
    step_index = len(forced)
    silence = source.timeout_s + CONNECT_TIMEOUT_S + 2.0
    try:
        while stop_reason is None:
            after = f" after {len(steps)} tokens" if steps else ""
            try:
                item = reader.next(should_stop, silence)
            except TimeoutError:
                raise RemoteError(f"the server sent nothing for {silence:g} s{after}: it stalled. Check the "
                                  "server, or raise the timeout") from None
            if item is None:
                stop_reason = "stopped"
                break
            kind, payload, arrived = item
            if kind == _END:
                break
            if kind == _ERROR:
                raise describe_failure(payload, source, "streaming the run", after) from None
            try:
                parts = chunk_parts(payload)
            except MalformedChunk as error:
                raise RemoteError(f"the server sent a malformed stream{after}: {error}. Is {source.api_url} an "
                                  "OpenAI-compatible API?") from None
            timings = parts.timings or timings
            usage = parts.usage or usage
            finish = parts.finish_reason or finish
            if not parts.entries and not parts.text:
                continue
            if len(steps) >= request.kwargs["max_tokens"]:  # a server that ignores max_tokens is cut here
                stop_reason = "max_new_tokens"
                break
            if not first_at:
                first_at = last_at = arrived
                yield _prefill(timings, started, arrived)
                yield from forced
            # The time this chunk took: the server's own clock where it reports one, else the arrival gap.
            predicted = timings.get("predicted_ms")
            if isinstance(predicted, (int, float)) and fmt.engine == "llama.cpp":
                chunk_ms, last_predicted_ms = max(float(predicted) - last_predicted_ms, 0.0), float(predicted)
            else:
                chunk_ms = (arrived - last_at) * 1000
            last_at = arrived
            try:
                new = chunk_steps(parts, fmt, step_index, chunk_ms, any(s.has_probs for s in steps))
            except MissingLogprobs:
                raise RemoteError(f"the server sent tokens without log-probabilities{after}: it ignores the "
                                  f"logprobs request ({source.api_url}), so there is nothing to show. llama-server "
                                  "and vLLM send them; `transformers serve` does not") from None
            except MalformedChunk as error:
                raise RemoteError(f"the server sent a malformed stream{after}: {error}") from None
            for step in new:
                steps.append(step)
                step_index += 1
                yield step
                if stop_watch.hit(step.text):
                    stop_reason = "stop_string"
                    break
            if stop_reason is None and should_stop():
                stop_reason = "stopped"
    finally:
        reader.close()  # the client shares ``http``'s pool, closed by the caller
    if stop_reason is None:
        if finish is None:
            raise RemoteError(f"the stream ended before the server said it was done (after {len(steps)} tokens): "
                              "the connection was cut or the server stopped. Check that it is still running")
        stop_reason = _stop_reason(finish, _tokens_generated(steps, usage, timings), request.kwargs["max_tokens"])
    if not first_at:
        yield from forced  # no token came: the forced ones still belong to the run
    figures = _figures(steps, timings, started, first_at, last_at)
    figures["server_tokens"] = float(_tokens_generated(steps, usage, timings))
    if stop_reason != "stopped":  # after Stop, return at once: no more requests
        figures.update(_server_figures(http, source, info, before))
    # A constrained reply is checked here: a server that ignored the constraint (a field it does not read) or read it
    # otherwise is said so in the run, never taken on trust.
    note, valid = reply_note(settings, "".join(s.text for s in [*forced, *steps]), complete=stop_reason == "eos")
    if valid is not None:
        figures["constraint_valid"] = valid
    yield _finished(forced, steps, stop_reason, timings, info, model, source, figures, usage, stop_note=note)


def _prefill(timings: dict[str, Any], started: float, arrived: float) -> PrefillDone:
    """The prompt's reading: the server's own count and time where it reports them, else time to first token."""
    prompt_n, cache_n, prompt_ms = (timings.get(k) for k in ("prompt_n", "cache_n", "prompt_ms"))
    if isinstance(prompt_n, int) and isinstance(prompt_ms, (int, float)):
        return PrefillDone(prompt_tokens=prompt_n + (cache_n if isinstance(cache_n, int) else 0),
                           prefill_ms=float(prompt_ms), kv_cache_bytes=0)
    return PrefillDone(prompt_tokens=0, prefill_ms=(arrived - started) * 1000, kv_cache_bytes=0)


def _tokens_generated(steps: list[RemoteTokenStep], usage: dict[str, Any], timings: dict[str, Any]) -> int:
    """Tokens the server generated: its own count where it gives one (merged entries stand for several)."""
    for value in (usage.get("completion_tokens"), timings.get("predicted_n")):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return len(steps)


def _stop_reason(finish: str, tokens: int, max_tokens: int) -> StopReason:
    # No stop strings are sent to the server (they are watched here), so "stop" is the end of the answer.
    if finish == "stop":
        return "eos"
    if finish == "length":
        return "max_new_tokens" if tokens >= max_tokens else "context_full"
    # The API's other finish reasons ("content_filter", "tool_calls", "function_call") as they are; an engine's own
    # is "unknown" (StopReason).
    return finish if finish in _SERVER_STOP_REASONS else "unknown"


_SERVER_STOP_REASONS = frozenset(STOP_REASONS) - {"stopped", "stop_string", "eos", "max_new_tokens", "context_full"}


def _figures(steps: list[RemoteTokenStep], timings: dict[str, Any], started: float, first_at: float,
             last_at: float) -> dict[str, float]:
    figures: dict[str, float] = {}
    if first_at:
        figures["time_to_first_token_ms"] = (first_at - started) * 1000
    if len(steps) > 1 and last_at > first_at:
        figures["client_tokens_per_s"] = (len(steps) - 1) / (last_at - first_at)
    figures["tokens_without_probs"] = float(sum(not s.has_probs for s in steps))
    figures["merged_entries"] = float(sum(s.merged_bytes > 0 for s in steps))
    names = {"predicted_per_second": "server_tokens_per_s", "prompt_per_second": "server_prompt_tokens_per_s",
             "cache_n": "prompt_tokens_cached", "draft_n": "draft_tokens", "draft_n_accepted": "accepted_draft_tokens"}
    for key, name in names.items():
        value = timings.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            figures[name] = float(value)
    if figures.get("draft_tokens"):
        figures["acceptance_rate"] = figures.get("accepted_draft_tokens", 0.0) / figures["draft_tokens"]
    return figures


_PER_POSITION = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position=\""


def _server_figures(http: Any, source: RemoteSource, info: EngineInfo, before: dict[str, float]) -> dict[str, float]:
    """Extras the engine reports after the run (best effort: a failure here leaves them out, never the run).

    /metrics counters are server-wide: they are read before and after the run, so another client's requests in
    between would count too."""
    figures: dict[str, float] = {}
    try:
        after = _metrics(http, source, info)
        for series, value in after.items():
            if series.startswith(_PER_POSITION):
                position = series[len(_PER_POSITION):].split('"')[0]
                figures[f"accepted_at_draft_position_{position}"] = value - before.get(series, 0.0)
        for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            if name in after:
                figures["kv_cache_usage"] = after[name]  # a fraction of the server's KV cache, 0..1
                break
        if info.slots:
            slots = get_json(http, source, "/slots", "reading the server's slots") or []
            served = [s for s in slots if isinstance(s, dict) and isinstance(s.get("id_task"), int)]
            if served:  # the most recent task is this run's (unless another client came in between)
                slot = max(served, key=lambda s: s["id_task"])
                tokens, n_ctx = slot.get("n_prompt_tokens"), slot.get("n_ctx")
                if isinstance(tokens, int) and isinstance(n_ctx, int) and n_ctx > 0:
                    figures.update(kv_tokens=float(tokens), n_ctx=float(n_ctx), kv_fill=tokens / n_ctx)
    except RemoteError:
        pass
    return figures


def _finished(forced: list[RemoteTokenStep], steps: list[RemoteTokenStep], stop_reason: StopReason,
              timings: dict[str, Any], info: EngineInfo, model: str, source: RemoteSource,
              figures: dict[str, float], usage: dict[str, Any] | None = None, stop_note: str = "") -> RunFinished:
    every = [*forced, *steps]
    decode_ms = sum(s.step_ms for s in steps)
    prompt_tokens = (usage or {}).get("prompt_tokens")
    if not isinstance(prompt_tokens, int):
        prompt_n, cache_n = timings.get("prompt_n"), timings.get("cache_n")
        prompt_tokens = (prompt_n if isinstance(prompt_n, int) else 0) + (cache_n if isinstance(cache_n, int) else 0)
    prefill_ms = timings.get("prompt_ms")
    return RunFinished(
        token_ids=tuple(s.token_id for s in every), text="".join(s.text for s in every), stop_reason=stop_reason,
        tokens_per_s=len(steps) / (decode_ms / 1000) if decode_ms > 0 else 0.0,
        prefill_ms=float(prefill_ms) if isinstance(prefill_ms, (int, float)) else figures.get(
            "time_to_first_token_ms", 0.0),
        decode_ms=decode_ms, prompt_tokens=prompt_tokens, model_name=_short(model), model_path=source.api_url,
        device=f"remote: {info.engine}", dtype=info.ftype, figures=figures, stop_note=stop_note,
    )
