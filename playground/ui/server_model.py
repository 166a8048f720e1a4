"""What the window does with a model on a server, apart from Qt: checking the server, naming its model, and turning
a click on an alternative of a server's run into a branch the server can continue (it takes text, not token ids).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from playground.config import ConfigError, RunSettings
from playground.events.remote import RemoteStarted
from playground.remote.branch import RemoteBranch
from playground.remote.source import RemoteSource
from playground.state import Branch, Run


def server_check(source: RemoteSource):  # -> JobBody
    """A job body that asks the server what it is and which model a run would use (RemoteError if none): yields
    one ``(source, EngineInfo, model)``."""

    def body(should_stop, progress) -> Iterator[Any]:
        from playground.remote.client import check_connection

        info = check_connection(source)
        yield source, info, info.resolve_model(source.model)

    return body


def model_label(model: str) -> str:
    """A model's name for labels: llama-server names its model by its GGUF's full path."""
    return model.rstrip("/").rsplit("/", 1)[-1] or model


def server_details(source: RemoteSource, info: Any, model: str) -> str:
    """One line for a tooltip: the engine, its build, the model and what the engine says of it."""
    meta = ", ".join(f"{k} {v}" for k, v in sorted(info.model_meta.items()))
    return (f"{info.engine} {info.version}".strip() + f"; model {model}" + (f" ({meta})" if meta else "")
            + (f"; API key from ${source.api_key_env}" if source.api_key_env else ""))


def check_remote_run(source: RemoteSource, settings: RunSettings, branch: RemoteBranch | None) -> None:
    """The remote runner's own up-front checks (ConfigError), with nothing sent: what a server cannot do is a
    message before a run exists, not a failed run."""
    from playground.remote.decode import run_remote

    run_remote(source, settings, branch=branch).close()  # a generator not started: no request is made


def remote_start(run: Run) -> RemoteStarted | None:
    return next((e for e in run.events[:4] if isinstance(e, RemoteStarted)), None)


def branch_remote_run(run: Run, step: int, token_id: int, source: RemoteSource | None,
                  model: str) -> tuple[RunSettings, Branch, RemoteBranch] | None:
    """Continue the server's run ``run`` from its step ``step`` with the candidate ``token_id``: the settings, the
    runs list's branch and the ``RemoteBranch`` to send. None when that step has no such candidate; ConfigError
    when the server in use (``source``, ``model``) is not the one that decoded the run, or it cannot continue."""
    made = remote_start(run)
    if source is None or made is None or (made.base_url, made.model) != (source.api_url, model):
        engine = made.engine if made is not None else "a server"
        where = made.base_url if made is not None else "a server"
        name = model_label(made.model) if made is not None else "its model"
        raise ConfigError(f"run #{run.index + 1} was decoded by {engine} at {where} ({name}); connect to that "
                          "server again (Server…) to branch from it")
    if not 0 <= step < len(run.steps):
        return None
    alternative = next((c for c in run.steps[step].candidates if c.token_id == token_id), None)
    if alternative is None:
        return None
    sent = RemoteBranch(tuple(run.steps), step, alternative).validate()
    # Token ids cannot be sent to a server: the branch carries the parent's steps instead of forced ids.
    settings = run.settings.replace(forced_token_ids=(), max_new_tokens=max(run.settings.max_new_tokens, step + 2))
    check_remote_run(source, settings, sent)
    return settings, Branch(parent=run.index, step=step, token_id=token_id, token_text=alternative.text), sent
