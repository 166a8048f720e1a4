"""Talking to a server: the OpenAI client for the API, plain HTTP for the engines' own endpoints, engine detection,
and every failure turned into a ``RemoteError`` that says what happened and what to do.

The ``openai`` package does the API (streaming, TLS verification, timeouts); it is built with ``max_retries=0`` and
explicit connect/read timeouts so a dead socket never hangs a run. llama-server's ``/props``, ``/slots``,
``/metrics`` and vLLM's ``/version`` are read with ``httpx2`` (the HTTP client ``openai`` itself uses).
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx2 as httpx
import openai

from playground.remote.errors import RemoteError
from playground.remote.source import RemoteSource

CONNECT_TIMEOUT_S = 10.0
ENGINES = ("llama.cpp", "vllm", "generic")


def timeouts(source: RemoteSource) -> httpx.Timeout:
    """Read/write/pool: ``timeout_s`` (the longest silence a stream may have); connect: at most 10 s."""
    return httpx.Timeout(source.timeout_s, connect=min(source.timeout_s, CONNECT_TIMEOUT_S))


def _auth_headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


_tls: ssl.SSLContext | None = None
_tls_lock = threading.Lock()


def tls_context() -> ssl.SSLContext:
    """The certificate-verifying TLS context, made once: building one costs ~20-35 ms, a client with it ~0.5 ms."""
    global _tls
    with _tls_lock:
        if _tls is None:
            _tls = httpx.create_ssl_context()
        return _tls


def open_client(source: RemoteSource, http: httpx.Client | None = None) -> openai.OpenAI:
    """The API client: no retries, explicit timeouts, TLS verified; the key read from its variable now.
    ``http``: the plain client to send its requests through (one connection pool for the whole run)."""
    key = source.api_key()
    # Never send the user's OpenAI organisation/project (read from OPENAI_ORG_ID/OPENAI_PROJECT_ID by default) to
    # some other server.
    headers: dict[str, Any] = {"OpenAI-Organization": openai.Omit(), "OpenAI-Project": openai.Omit()}
    return openai.OpenAI(base_url=source.api_url, api_key=key or "unused", max_retries=0,
                         timeout=timeouts(source), default_headers=headers, http_client=http or open_http(source))


def request_headers(source: RemoteSource) -> dict[str, Any]:
    """Per-request headers for ``create(extra_headers=...)``: without a key, no Authorization header at all."""
    return {} if source.api_key_env else {"Authorization": openai.Omit()}


def open_http(source: RemoteSource) -> httpx.Client:
    """A plain client for the engines' own endpoints (same timeouts and key as the API)."""
    return httpx.Client(timeout=timeouts(source), headers=_auth_headers(source.api_key()), follow_redirects=False,
                        verify=tls_context())


# ---- failures -----------------------------------------------------------------------------------------------------

def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _server_message(error: BaseException) -> str:
    """What the server said about a refused request (its JSON error message, or the start of its body)."""
    body: Any = getattr(error, "body", None)
    response = getattr(error, "response", None)
    if body is None and response is not None:
        try:
            body = response.json()
        except (ValueError, httpx.HTTPError):
            try:
                body = response.text
            except httpx.HTTPError:
                body = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        body = inner.get("message", inner) if isinstance(inner, dict) else inner
        if isinstance(body, dict):
            body = body.get("detail") or json.dumps(body)[:300]
    text = " ".join(str(body).split()) if body else ""
    return text[:300]


def _scrub(message: str, source: RemoteSource) -> str:
    """Take the key out of a message, should a server have echoed it."""
    key = os.environ.get(source.api_key_env, "") if source.api_key_env else ""
    return message.replace(key, "<the API key>") if len(key) >= 4 else message


def _host(source: RemoteSource) -> str:
    parts = urlsplit(source.root_url)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


def describe_failure(error: BaseException, source: RemoteSource, doing: str, after: str = "") -> RemoteError:
    """The ``RemoteError`` for a failure while ``doing`` something ("streaming the run"); ``after`` says how far the
    run got (" after 12 tokens")."""
    return RemoteError(_scrub(_message(error, source, doing, after), source))


def _status_message(code: int, error: BaseException, source: RemoteSource, doing: str, url: str) -> str:
    said = _server_message(error)
    said_text = f": {said}" if said else ""
    if code in (401, 403):
        if source.api_key_env:
            return (f"the server refused the API key read from the environment variable {source.api_key_env} "
                    f"(HTTP {code}{said_text}): check that it holds this server's key")
        return (f"the server needs an API key (HTTP {code}{said_text}): put it in an environment variable and "
                "name that variable as the API key variable (--api-key-env)")
    if code == 404:
        return (f"{url} was not found (HTTP 404{said_text}) while {doing}: check the server URL (the server's "
                "OpenAI-compatible API, e.g. http://HOST:PORT/v1) and the model name")
    if code == 429:
        return f"the server is busy (HTTP 429{said_text}): try again in a moment"
    if code >= 500:
        return (f"the server failed (HTTP {code}{said_text}) while {doing}: its log says more; try again, or "
                "restart the server")
    return f"the server refused the request (HTTP {code}{said_text}) while {doing}"


def _message(error: BaseException, source: RemoteSource, doing: str, after: str) -> str:
    host = _host(source)
    chain = list(_chain(error))
    if isinstance(error, RemoteError):
        return str(error)
    for item in chain:
        if isinstance(item, openai.APIStatusError):
            return _status_message(item.status_code, item, source, doing, str(item.request.url))
        if isinstance(item, httpx.HTTPStatusError):
            return _status_message(item.response.status_code, item, source, doing, str(item.request.url))
    for item in chain:
        if isinstance(item, ssl.SSLCertVerificationError):
            return (f"the TLS certificate of {host} could not be verified ({item.verify_message}): use the host name "
                    "the certificate names, or make its CA trusted (e.g. SSL_CERT_FILE=/path/to/ca.pem)")
        if isinstance(item, ssl.SSLError):
            return (f"the TLS handshake with {host} failed ({item.reason or item}): does the server speak https on "
                    "this port? (a plain server takes http://)")
        if isinstance(item, ConnectionRefusedError):
            return (f"{host} refused the connection: no server is listening there. Start the server, or check the "
                    "URL's host and port")
        if isinstance(item, socket.gaierror):
            return f"the host name in {source.root_url} could not be found: check the server URL"
    for item in chain:
        if isinstance(item, (httpx.ConnectTimeout, httpx.PoolTimeout)):
            return (f"connecting to {host} timed out after {min(source.timeout_s, CONNECT_TIMEOUT_S):g} s: is the "
                    "host reachable (network, firewall)?")
        if isinstance(item, (openai.APITimeoutError, httpx.TimeoutException)):
            return (f"the server sent nothing for {source.timeout_s:g} s while {doing}{after}: it stalled (busy, "
                    "or reading a long prompt on a slow model). Check the server, or raise the timeout")
    for item in chain:
        if isinstance(item, json.JSONDecodeError):
            snippet = " ".join(item.doc[:80].split())
            return (f"the server sent a malformed stream{after}: an event is not JSON ({snippet!r}). Is "
                    f"{source.api_url} an OpenAI-compatible API?")
        if isinstance(item, (httpx.RemoteProtocolError, httpx.ReadError)) or (
                isinstance(item, openai.APIConnectionError) and isinstance(item.__cause__, httpx.TransportError)):
            return (f"the connection to {host} was cut while {doing}{after}: the server closed it or stopped. "
                    "Check that it is still running")
        if isinstance(item, httpx.ConnectError):
            return f"could not connect to {host} ({item}): check the server URL and that the server is running"
    if isinstance(error, openai.APIConnectionError):  # (a subclass of APIError: first)
        return f"could not talk to {host} while {doing}{after}: check the server URL and that the server is running"
    if isinstance(error, openai.APIError):  # an error event in the middle of the stream
        return f"the server reported an error while {doing}{after}: {_server_message(error) or error.message}"
    return f"{doing} failed{after}: {type(error).__name__}: {error}"


# ---- the engines' own endpoints -------------------------------------------------------------------------------------

def get_json(http: httpx.Client, source: RemoteSource, path: str, doing: str) -> Any | None:
    """GET ``root + path`` as JSON; None when the server has no such endpoint (404/405/501) or answers no JSON."""
    url = source.root_url + path
    try:
        response = http.get(url)
    except httpx.HTTPError as error:
        raise describe_failure(error, source, doing) from None
    if response.status_code in (404, 405, 501):
        return None
    if response.status_code >= 400:
        raise describe_failure(httpx.HTTPStatusError("", request=response.request, response=response), source, doing)
    try:
        return response.json()
    except ValueError:
        return None


def get_text(http: httpx.Client, source: RemoteSource, path: str) -> str | None:
    """GET ``root + path`` as text, or None on any failure (for optional extras: metrics)."""
    try:
        response = http.get(source.root_url + path)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {series (name with its labels): value}."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            values[name.strip()] = float(value)
        except ValueError:
            continue
    return values


@dataclass(frozen=True)
class EngineInfo:
    """What a server is: its engine, version, models and extras."""

    engine: str  # "llama.cpp" | "vllm" | "generic"
    version: str
    models: tuple[str, ...]
    model_meta: dict[str, Any] = field(default_factory=dict)  # per the chosen model (llama-server: n_params, ...)
    n_ctx: int = 0
    metrics: bool = False  # /metrics answers (llama-server: started with --metrics)
    slots: bool = False  # llama-server's /slots answers
    speculative: bool = False  # llama-server drafts tokens (a slot says so)
    ftype: str = ""  # llama-server's model quantization type ("Q4_1", ...)

    def resolve_model(self, wanted: str) -> str:
        """The model to ask for: ``wanted``, or the server's only model; RemoteError when that cannot work."""
        if wanted:
            if not self.models or wanted in self.models:
                return wanted
            # llama-server names its model by the GGUF's path: its file name is enough.
            by_file = [m for m in self.models if m.rstrip("/").rsplit("/", 1)[-1] == wanted]
            if len(by_file) == 1:
                return by_file[0]
            raise RemoteError(f"the server has no model {wanted!r}; it serves: {', '.join(self.models)}")
        if len(self.models) == 1:
            return self.models[0]
        if not self.models:
            raise RemoteError("the server lists no models: name the model to use (--remote-model)")
        raise RemoteError(f"the server serves {len(self.models)} models ({', '.join(self.models)}): choose one "
                          "(--remote-model)")


def list_models(source: RemoteSource, http: httpx.Client | None = None) -> list[dict[str, Any]]:
    """The server's ``/v1/models`` entries as JSON (the id and whatever else the engine adds)."""
    own = http is None
    http = http or open_http(source)
    doing = "listing the server's models"
    try:
        try:
            response = http.get(source.api_url + "/models")
        except httpx.HTTPError as error:
            raise describe_failure(error, source, doing) from None
        if response.status_code >= 400:
            raise describe_failure(httpx.HTTPStatusError("", request=response.request, response=response), source,
                                   doing)
        try:
            data = response.json().get("data")
        except (ValueError, AttributeError):
            data = None
        if not isinstance(data, list):
            raise RemoteError(f"{source.api_url}/models did not answer with a model list: is this an "
                              "OpenAI-compatible API? (the URL should end at the API's root, e.g. .../v1)")
        return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    finally:
        if own:
            http.close()


def detect_engine(source: RemoteSource, http: httpx.Client | None = None, model: str = "") -> EngineInfo:
    """Which engine serves ``source`` and its extras; ``model``: whose metadata to keep ("" = the first)."""
    own = http is None
    http = http or open_http(source)
    try:
        entries = list_models(source, http)
        names = tuple(m["id"] for m in entries)
        chosen = next((m for m in entries if m["id"] == model), entries[0] if entries else {})
        doing = "asking the server what it is"
        props = get_json(http, source, "/props", doing)
        if isinstance(props, dict) and ("build_info" in props or "default_generation_settings" in props):
            return _llama_info(http, source, props, names, chosen)
        version = get_json(http, source, "/version", doing)
        if any(m.get("owned_by") == "vllm" for m in entries) or (
                isinstance(version, dict) and isinstance(version.get("version"), str)):
            n_ctx = chosen.get("max_model_len")
            return EngineInfo(engine="vllm", version=str((version or {}).get("version", "")), models=names,
                              n_ctx=n_ctx if isinstance(n_ctx, int) else 0,
                              metrics=get_text(http, source, "/metrics") is not None)
        return EngineInfo(engine="generic", version="", models=names)
    finally:
        if own:
            http.close()


def _llama_info(http: httpx.Client, source: RemoteSource, props: dict[str, Any], names: tuple[str, ...],
                chosen: dict[str, Any]) -> EngineInfo:
    given = chosen.get("meta")
    meta: dict[str, Any] = given if isinstance(given, dict) else {}
    settings = props.get("default_generation_settings")
    n_ctx: Any = settings.get("n_ctx") if isinstance(settings, dict) else None
    slots = get_json(http, source, "/slots", "reading the server's slots") if props.get("endpoint_slots", True) \
        else None
    slot_list = slots if isinstance(slots, list) else []
    if not isinstance(n_ctx, int):
        n_ctx = next((s.get("n_ctx") for s in slot_list if isinstance(s, dict)), None)
    if not isinstance(n_ctx, int):
        n_ctx = meta.get("n_ctx") if isinstance(meta.get("n_ctx"), int) else 0
    return EngineInfo(
        engine="llama.cpp", version=str(props.get("build_info", "")), models=names,
        model_meta={k: v for k, v in meta.items() if isinstance(v, (int, float, str))},
        n_ctx=n_ctx, metrics=bool(props.get("endpoint_metrics")), slots=bool(slot_list),
        speculative=any(isinstance(s, dict) and s.get("speculative") for s in slot_list),
        ftype=str(props.get("model_ftype", "")),
    )


def check_connection(source: RemoteSource) -> EngineInfo:
    """The window's "test connection": the server's engine and models, or a RemoteError saying what is wrong."""
    source.validate()
    return detect_engine(source)
