"""Finding and building llama-server: the override, the cache, and a clear message when a tool is missing."""

from __future__ import annotations

import pytest
from support.llama_build import ENV_OVERRIDE, BuildError, build_server, cached_server, server_dir


def test_the_override_wins_and_a_missing_override_finds_nothing(tmp_path, monkeypatch):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    monkeypatch.setenv(ENV_OVERRIDE, str(binary))
    assert cached_server() == binary
    monkeypatch.setenv(ENV_OVERRIDE, str(tmp_path / "absent"))
    assert cached_server() is None


def test_the_cache_holds_one_build_per_pinned_source(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_OVERRIDE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert server_dir() == tmp_path / "decoding-playground" / "llama-server" / "0.3.36"
    assert cached_server() is None
    server_dir().mkdir(parents=True)
    (server_dir() / "llama-server").write_text("built")
    assert cached_server() == server_dir() / "llama-server"


def test_a_missing_compiler_tool_is_named_before_any_download(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # a machine without cmake or a compiler
    said: list[str] = []
    with pytest.raises(BuildError, match=r"building llama-server needs cmake: install it"):
        build_server(said.append)
    assert said == []  # nothing was downloaded
