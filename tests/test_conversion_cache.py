"""The GGUF conversion cache: keyed by the file's SHA-256 (remembered per path, size and modification time), found
again under another name, listed with its size and cleared from the command line; a conversion reports progress per
tensor and stops when asked; a damaged file fails as a ModelLoadError and leaves nothing behind. The Gemma 3 fetch's
checks on synthetic wheels. (The real conversion runs in tests/test_gemma.py's fixture when Gemma is not fetched.)"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import zipfile
from types import SimpleNamespace

import pytest

from playground.cli import main
from playground.config import ModelSettings, RunSettings
from playground.engine.strategies import run_strategy
from playground.models import bundled, conversion_cache
from playground.models.conversion_cache import (
    MARKER,
    ConversionFailed,
    ConversionStopped,
    cache_dir,
    cache_entries,
    file_sha256,
)
from playground.models.default_model import FetchError
from playground.models.loading import ModelLoadError, load_model


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """The user cache in a temporary folder (the conversion cache lives under it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path


def test_the_hash_is_remembered_until_the_file_changes(cache_home):
    path = cache_home / "m.gguf"
    path.write_bytes(b"GGUF" + os.urandom(5000))
    first = file_sha256(path)
    assert first == hashlib.sha256(path.read_bytes()).hexdigest()
    stat = path.stat()
    path.write_bytes(b"GGUF" + os.urandom(5000))  # same size; the same modification time put back
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert file_sha256(path) == first  # not read again: the memo answered
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest() != first
    memo = json.loads((cache_dir() / conversion_cache.HASHES).read_text())
    path.unlink()
    other = cache_home / "n.gguf"
    other.write_bytes(b"GGUF")
    file_sha256(other)
    assert os.path.realpath(path) in memo and list(json.loads((cache_dir() / conversion_cache.HASHES).read_text())) \
        == [os.path.realpath(other)]  # a file that is gone is forgotten


def _cache_by_hand(gguf, model_folder):
    """A finished conversion of ``gguf`` in the cache: the tiny model's folder under the file's hash."""
    entry = cache_dir() / hashlib.sha256(gguf.read_bytes()).hexdigest()
    shutil.copytree(model_folder, entry)
    (entry / MARKER).write_text(json.dumps({"source": str(gguf), "converted_at": 1e9, "seconds": 61.0}))
    return entry


def test_a_cached_gguf_loads_from_the_cache_under_any_name(cache_home, model_folder, tiny_lm, capsys):
    gguf = cache_home / "not-really.gguf"
    gguf.write_bytes(b"GGUF" + os.urandom(3000))  # converting this would fail: loading it proves the cache answered
    entry = _cache_by_hand(gguf, model_folder)
    copy = cache_home / "renamed.gguf"
    shutil.copy(gguf, copy)
    lm = load_model(ModelSettings(path=str(copy), device="cpu"))
    assert lm.path == str(copy) and lm.name == "renamed"
    settings = RunSettings(prompt="Hello", max_new_tokens=6)
    assert list(run_strategy(lm, settings))[-1].token_ids == list(run_strategy(tiny_lm, settings))[-1].token_ids

    size = sum(p.stat().st_size for p in cache_dir().rglob("*") if p.is_file())
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"1 converted GGUF file, {conversion_cache.describe_size(size)}" in out
    assert str(gguf) in out and entry.name[:12] in out and "converted in 61 s" in out
    assert [e.sha256 for e in cache_entries()] == [entry.name]
    assert main(["cache", "--clear"]) == 0
    assert f"removed {conversion_cache.describe_size(size)}" in capsys.readouterr().out
    assert not cache_dir().exists() and cache_entries() == []


def test_a_damaged_gguf_is_a_model_load_error_and_leaves_nothing(cache_home):
    bad = cache_home / "broken.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    with pytest.raises(ConversionFailed, match="could not load broken") as failure:
        load_model(ModelSettings(path=str(bad)))
    assert isinstance(failure.value, ModelLoadError)
    assert [p.name for p in cache_dir().iterdir()] == [conversion_cache.HASHES]  # no entry, no left-over


def test_the_tensor_loop_reports_by_bytes_and_stops_between_tensors():
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    # The loop this wraps is transformers' own, through its module's ``tqdm``: still there?
    assert "in tqdm(reader.tensors" in inspect.getsource(gguf_utils.load_gguf_checkpoint)
    original = gguf_utils.tqdm
    tensors = [SimpleNamespace(n_bytes=n) for n in (600, 200, 200)]
    said = []
    with conversion_cache._tensor_progress(lambda m, f: said.append(f), lambda: False, "m.gguf"):
        assert list(gguf_utils.tqdm(tensors, desc="x")) == tensors
    assert gguf_utils.tqdm is original
    assert said[0] == pytest.approx(0.3 + 0.55 * 0.6) and said[-1] == pytest.approx(0.85)
    seen = []
    with pytest.raises(ConversionStopped, match="stopped; nothing was kept"), \
            conversion_cache._tensor_progress(lambda m, f: None, lambda: len(seen) == 2, "m.gguf"):
        seen.extend(gguf_utils.tqdm(tensors))
    assert seen == tensors[:2] and gguf_utils.tqdm is original


def test_a_stop_while_hashing_keeps_nothing(cache_home):
    path = cache_home / "big.gguf"
    path.write_bytes(os.urandom(3 * conversion_cache.HASH_BLOCK))
    with pytest.raises(ConversionStopped):
        conversion_cache.converted_folder(path, should_stop=lambda: True)
    assert not (cache_dir() / conversion_cache.HASHES).exists()


def test_the_fast_tokenizer_read_is_kept_only_when_it_matches(tmp_path, model_folder):
    folder = tmp_path / "m"
    shutil.copytree(model_folder, folder)
    from transformers import AutoTokenizer

    full = AutoTokenizer.from_pretrained(folder)
    conversion_cache._mark_fast_tokenizer(folder, full)
    fast = conversion_cache.fast_tokenizer(folder)
    assert fast is not None and fast.encode(conversion_cache.PROBE) == full.encode(conversion_cache.PROBE)
    assert fast.eos_token_id == full.eos_token_id and fast.chat_template == full.chat_template
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|endoftext|>"}))
    conversion_cache._mark_fast_tokenizer(folder, full)  # now it would give another EOS: not kept
    assert conversion_cache.fast_tokenizer(folder) is None


# --- the Gemma 3 fetch's checks -----------------------------------------------------------------------------------
def _wheels(tmp_path, chunks, sums):
    main_wheel = tmp_path / f"{bundled._module(None)}-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(main_wheel, "w") as archive:
        archive.writestr(f"{bundled._module(None)}/data/SHA256SUMS", sums)
    parts = []
    for index, chunk in enumerate(chunks):
        part = tmp_path / f"{bundled._module(index + 1)}-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(part, "w") as archive:
            archive.writestr(f"{bundled._module(index + 1)}/data/{bundled.GEMMA_GGUF}.part{index:02d}", chunk)
        parts.append(part)
    return [main_wheel, *parts]


def test_joined_chunks_that_do_not_match_the_published_hash_are_refused(tmp_path):
    chunks = [b"GGUF", b"abc", b"def", b"ghi"]
    joined = hashlib.sha256(b"".join(chunks)).hexdigest()
    out = tmp_path / "out.gguf"
    with pytest.raises(FetchError, match=f"SHA256SUMS says {joined}, the file is {joined}"):
        bundled.join_gemma_chunks(_wheels(tmp_path, chunks, f"{joined}  {bundled.GEMMA_GGUF}\n"), out,
                                  lambda m, f: None, lambda: False)  # agrees with itself, not with the pin
    assert not out.exists()
    wheels = _wheels(tmp_path, chunks, f"{bundled.GEMMA_SHA256}  other.gguf\n")
    with pytest.raises(FetchError, match="SHA256SUMS says nothing"):
        bundled.join_gemma_chunks(wheels, out, lambda m, f: None, lambda: False)
    wheels[2].write_bytes(b"<html>proxy error</html>")
    with pytest.raises(FetchError, match="damaged or not the expected one"):
        bundled.join_gemma_chunks(wheels, out, lambda m, f: None, lambda: False)
    assert not out.exists()


def test_the_published_hash_is_read_as_sha256sum_writes_it():
    line = f"{bundled.GEMMA_SHA256}  {bundled.GEMMA_GGUF}"
    assert bundled.published_sha256(f"# sums\n{line}\n") == bundled.GEMMA_SHA256
    assert bundled.published_sha256(f"{bundled.GEMMA_SHA256} *{bundled.GEMMA_GGUF}") == bundled.GEMMA_SHA256
    assert bundled.published_sha256(f"{bundled.GEMMA_SHA256[:-1]}  {bundled.GEMMA_GGUF}") is None


def test_the_terms_text_starts_at_the_terms():
    page = ("<html><nav>Models Docs Sign in</nav><article><p>Last modified: March 24, 2025</p><script>x()</script>"
            "<p>By using, reproducing &amp; distributing Gemma</p><h2>Section 1</h2></article><footer>f</footer>")
    assert bundled.terms_text(page) == ("Last modified: March 24, 2025\nBy using, reproducing & distributing Gemma\n"
                                        "Section 1\n")


def test_bundled_names_resolve_and_say_how_to_fetch(cache_home):
    from playground.models.loading import resolve_model_source

    assert bundled.find_bundled("Gemma-3-270M").key == "gemma-3-270m" and bundled.find_bundled(None).default
    with pytest.raises(ModelLoadError, match=r"run `playground fetch-model gemma-3-270m` \(238 MB"):
        resolve_model_source("gemma-3-270m")
    assert main(["fetch-model", "nope"]) == 2
