"""Loading real model files, and every bad input giving a clear message (never a crash)."""

from __future__ import annotations

import json

import pytest
import torch

from playground.config import ConfigError, ModelSettings, RunSettings
from playground.engine.strategies import run_strategy
from playground.models.device import choose_device, choose_dtype
from playground.models.loading import ModelLoadError, load_model


@pytest.fixture(scope="module")
def saved_tiny(model_folder):
    return model_folder


def test_folder_loads_and_decodes_like_the_original(saved_tiny, tiny_lm):
    lm = load_model(ModelSettings(path=str(saved_tiny), device="cpu"))
    assert lm.name == saved_tiny.name and lm.device.type == "cpu" and lm.dtype == torch.float32
    settings = RunSettings(prompt="Hello", max_new_tokens=10)
    assert list(run_strategy(lm, settings))[-1].token_ids == list(run_strategy(tiny_lm, settings))[-1].token_ids


def test_bfloat16_is_honoured(saved_tiny):
    lm = load_model(ModelSettings(path=str(saved_tiny), dtype="bfloat16"))
    assert lm.model.dtype == torch.bfloat16 and lm.dtype_name == "bfloat16"


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="no model at"):
        load_model(ModelSettings(path=str(tmp_path / "nothing-here")))


def test_model_id_not_in_cache_is_not_downloaded(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError, match="nothing is downloaded"):
        load_model(ModelSettings(path="HuggingFaceTB/SmolLM2-135M-Instruct"))


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_model(ModelSettings(path=str(tmp_path)))


def test_plain_file_is_not_a_model(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ModelLoadError, match=r"not a \.gguf"):
        load_model(ModelSettings(path=str(text)))


def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    with pytest.raises(ModelLoadError, match="could not load broken"):
        load_model(ModelSettings(path=str(bad)))


def test_corrupt_safetensors(tmp_path, saved_tiny):
    folder = tmp_path / "damaged"
    folder.mkdir()
    for item in saved_tiny.iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 5000])  # truncated download
    with pytest.raises(ModelLoadError, match="could not load damaged"):
        load_model(ModelSettings(path=str(folder)))


def test_corrupt_config(tmp_path, saved_tiny):
    folder = tmp_path / "badconfig"
    folder.mkdir()
    (folder / "config.json").write_text("{ not json")
    with pytest.raises(ModelLoadError, match="could not load badconfig"):
        load_model(ModelSettings(path=str(folder)))


def test_remote_code_is_not_run_without_consent(tmp_path, saved_tiny):
    folder = tmp_path / "remote"
    folder.mkdir()
    config = json.loads((saved_tiny / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(ModelLoadError, match="trust_remote_code"):
        load_model(ModelSettings(path=str(folder)))


def test_absent_device_and_bad_names():
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="not available"):
            choose_device("cuda")
    assert choose_device("auto").type in {"cuda", "mps", "cpu"}
    assert choose_dtype("auto", torch.device("cpu")) == torch.float32
    with pytest.raises(ConfigError, match="device must be one of"):
        ModelSettings(device="tpu").validate()


def test_default_model_missing_says_how_to_fetch(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ModelLoadError, match="fetch-model"):
        load_model(ModelSettings())


def test_model_id_from_the_local_hf_cache(monkeypatch, tmp_path, saved_tiny):
    """A model already in the HF cache layout (refs/main -> snapshots/<rev>) loads by its id, offline."""
    repo = tmp_path / "hub" / "models--someone--tiny-llama"
    snapshot = repo / "snapshots" / "0123456789abcdef"
    snapshot.mkdir(parents=True)
    for item in saved_tiny.iterdir():
        (snapshot / item.name).write_bytes(item.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123456789abcdef")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    lm = load_model(ModelSettings(path="someone/tiny-llama"))
    assert lm.name == "someone/tiny-llama" and lm.path == str(snapshot)


class _Exploit:
    """A pickle that would create a file when unpickled without weights_only."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickled_checkpoint_is_never_unpickled_arbitrarily(tmp_path, saved_tiny):
    folder = tmp_path / "pickled"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((saved_tiny / name).read_bytes())
    marker = tmp_path / "exploit-ran"
    torch.save({"model.embed_tokens.weight": _Exploit(str(marker))}, folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError):
        load_model(ModelSettings(path=str(folder)))
    assert not marker.exists(), "loading ran code from a pickle"
