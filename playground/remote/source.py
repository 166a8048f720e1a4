"""Where a remote model lives: an OpenAI-compatible server (llama.cpp's ``llama-server``, vLLM, ...).

The API key is never part of these settings: ``api_key_env`` names the environment variable that holds it, and the
key is read from the environment only when a request is made (so it never reaches a saved run, a trace, a
screenshot or an error message).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from playground.config.errors import ConfigError
from playground.config.groups import RESERVED_FLAGS
from playground.config.table import check_all, from_plain, rows, setting

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class RemoteSource:
    """A server to stream a run from; one row per field drives the CLI flag and the window's "Server…" form."""

    base_url: str = setting("", "server URL", "the server's OpenAI-compatible API, e.g. http://127.0.0.1:8080/v1 "
                            "(llama-server, vLLM, ...)", flag="--base-url")
    model: str = setting("", "model", "the server's model to use; empty = the server's only model",
                         flag="--remote-model")
    api_key_env: str = setting("", "API key variable", "NAME of the environment variable that holds the server's "
                               "API key (the key itself is never stored); empty = no key", flag="--api-key-env")
    timeout_s: float = setting(60.0, "timeout (s)", "longest wait for the server's next bytes (connecting: at most "
                               "10 s); a stalled server ends the run with a message after this long", minimum=0.0,
                               above_minimum=True, maximum=3600.0, step=5.0, flag="--remote-timeout")
    post_sampling_probs: bool = setting(False, "post-sampler probabilities", "llama-server only: report "
                                        "probabilities after its sampler chain (the distribution the token was "
                                        "drawn from) instead of the raw softmax", flag="--post-sampling-probs")

    def validate(self) -> RemoteSource:
        check_all(self)
        url = self.base_url.strip()
        if not url:
            raise ConfigError("the server URL is empty: give the server's address, e.g. http://127.0.0.1:8080/v1")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            hint = f" (did you mean http://{url}?)" if "://" not in url else ""
            raise ConfigError(f"the server URL must start with http:// or https://{hint}")
        if not parts.hostname:
            raise ConfigError("the server URL has no host name: write it as http://HOST:PORT/v1")
        if parts.username or parts.password:
            raise ConfigError("the server URL must not hold a user name or password: put the API key in an "
                              "environment variable and name it with --api-key-env")
        if parts.query or parts.fragment:
            raise ConfigError("the server URL must not have a ?query or #fragment: give the API's root, e.g. "
                              "http://127.0.0.1:8080/v1")
        try:
            parts.port  # noqa: B018  (raises on a port that is not a number)
        except ValueError:
            raise ConfigError("the server URL's port is not a number") from None
        if any(ord(c) < 32 for c in self.model):
            raise ConfigError("the model name must not hold control characters (newlines, tabs)")
        if self.api_key_env and not _ENV_NAME.fullmatch(self.api_key_env):
            # Never echo the value: a user may have pasted the key itself here.
            raise ConfigError("the API key setting takes the NAME of an environment variable (letters, digits and "
                              "_, e.g. VLLM_API_KEY), not the key itself")
        return self

    @property
    def root_url(self) -> str:
        """The server's root (where llama-server's /props and vLLM's /version live): the URL without ``/v1``."""
        url = self.base_url.strip().rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url

    @property
    def api_url(self) -> str:
        """The OpenAI-compatible API's base (``.../v1``)."""
        return self.root_url + "/v1"

    def api_key(self) -> str:
        """The key, read from the environment now ("" when no variable is named). Never store what this returns."""
        if not self.api_key_env:
            return ""
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise ConfigError(f"the environment variable {self.api_key_env} (named as the API key's variable) is "
                              "not set or empty: export it with the server's API key, or leave the setting empty "
                              "for a server that needs no key")
        return key

    def replace(self, **changes: Any) -> RemoteSource:
        return dataclasses.replace(self, **changes)

    def as_plain_dict(self) -> dict[str, Any]:
        """JSON values of the settings: the key's variable NAME, never the key."""
        return {row.name: getattr(self, row.name) for row in rows(RemoteSource)}

    @classmethod
    def from_plain_dict(cls, plain: dict[str, Any]) -> tuple[RemoteSource, list[str]]:
        values, unknown = from_plain(cls, plain)
        return cls(**values), unknown


RESERVED_FLAGS.update(row.flag for row in rows(RemoteSource))
