"""A GGUF is converted once: the float model dequantized from a ``.gguf`` file is kept as a safetensors folder in
the user cache, keyed by the file's SHA-256, so a second load of the same file (wherever it lies, under whatever
name) reads that folder instead of dequantizing again.

Hashing a 253 MB file costs about half a second; the hash of each file seen is remembered with its (path, size,
modification time), so a second load of an unchanged file does not read it at all.

The conversion reports its progress tensor by tensor (weighted by the tensors' bytes) and polls a Stop check between
tensors; a stopped or failed conversion leaves nothing in the cache. ``playground cache`` lists the cache and its
size, ``playground cache --clear`` empties it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playground.config.catalog import Progress, StopCheck
from playground.models.load_errors import ModelLoadError
from playground.models.paths import cache_root

MARKER = "playground-conversion.json"  # written last: a folder without it is not a finished conversion
HASHES = "hashes.json"  # {realpath: {"size", "mtime_ns", "sha256"}}
HASH_BLOCK = 1 << 22


class ConversionFailed(ModelLoadError):
    """A GGUF could not be converted (a damaged file, or a model transformers cannot read from GGUF)."""


class ConversionStopped(ConversionFailed):
    """The user stopped the conversion; nothing was kept."""


def cache_dir() -> Path:
    return cache_root() / "gguf-cache"


@dataclass(frozen=True)
class CacheEntry:
    sha256: str
    folder: Path
    source: str  # the file it was converted from (first seen there)
    size_bytes: int  # of the converted folder
    converted_at: float  # seconds since the epoch
    seconds: float  # how long the conversion took


# --- hashing, remembered ------------------------------------------------------------------------------------------
def _read_hashes() -> dict[str, Any]:
    try:
        known = json.loads((cache_dir() / HASHES).read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _write_hashes(known: dict[str, Any]) -> None:
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=folder, prefix=".hashes-", delete=False) as out:
        json.dump(known, out, indent=1)
    os.replace(out.name, folder / HASHES)


def file_sha256(path: Path, should_stop: StopCheck | None = None) -> str:
    """The file's SHA-256, read again only when its size or modification time changed since last time."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    known = _read_hashes()
    seen = known.get(real)
    if isinstance(seen, dict) and seen.get("size") == stat.st_size and seen.get("mtime_ns") == stat.st_mtime_ns:
        return str(seen["sha256"])
    digest = hashlib.sha256()
    with open(real, "rb") as file:
        while block := file.read(HASH_BLOCK):
            digest.update(block)
            if should_stop is not None and should_stop():
                raise ConversionStopped(f"reading {Path(path).name} was stopped; nothing was kept")
    sha = digest.hexdigest()
    known = {path: seen for path, seen in _read_hashes().items() if os.path.exists(path)}  # files gone: forgotten
    known[real] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha}
    _write_hashes(known)
    return sha


# --- the cache ----------------------------------------------------------------------------------------------------
def cached_folder(sha256: str) -> Path | None:
    folder = cache_dir() / sha256
    return folder if (folder / MARKER).is_file() and (folder / "config.json").is_file() else None


def _folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def cache_entries() -> list[CacheEntry]:
    """The finished conversions, newest first."""
    root = cache_dir()
    entries = []
    for marker in root.glob(f"*/{MARKER}") if root.is_dir() else ():
        try:
            info = json.loads(marker.read_text())
        except (OSError, ValueError):
            info = {}
        entries.append(CacheEntry(sha256=marker.parent.name, folder=marker.parent, source=str(info.get("source", "?")),
                                  size_bytes=_folder_size(marker.parent),
                                  converted_at=float(info.get("converted_at", marker.stat().st_mtime)),
                                  seconds=float(info.get("seconds", 0.0))))
    return sorted(entries, key=lambda e: e.converted_at, reverse=True)


def cache_size() -> int:
    """Bytes the cache takes on disk (finished conversions and any left-overs of interrupted ones)."""
    root = cache_dir()
    return _folder_size(root) if root.is_dir() else 0


def clear_cache() -> int:
    """Remove every conversion (and the remembered hashes); the bytes freed."""
    freed = cache_size()
    root = cache_dir()
    if root.is_dir():
        shutil.rmtree(root)
    return freed


def describe_size(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def converted_folder(gguf: Path, progress: Progress | None = None, should_stop: StopCheck | None = None,
                     known: Callable[[str], Path | None] | None = None) -> Path:
    """The cached float model of ``gguf``, converted now (once) if the cache has none; ``known(sha256)`` may name
    a folder converted elsewhere from the same file (a bundled model's)."""
    say = progress or (lambda message, fraction: None)
    say(f"Checking {gguf.name} against the conversion cache…", 0.02)
    try:
        sha = file_sha256(gguf, should_stop)
    except OSError as error:
        raise ConversionFailed(f"could not read {gguf}: {error}") from error
    found = (known(sha) if known is not None else None) or cached_folder(sha)
    if found is not None:
        return found
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".convert-") as tmp:
        work = Path(tmp) / "model"
        started = time.perf_counter()
        convert_gguf(gguf, work, progress, should_stop)
        (work / MARKER).write_text(json.dumps({"source": str(gguf), "sha256": sha, "converted_at": time.time(),
                                               "seconds": round(time.perf_counter() - started, 1)}, indent=2))
        target = root / sha
        if target.exists():  # a left-over without its marker
            shutil.rmtree(target)
        work.rename(target)  # atomic on one filesystem: a half-written folder is never found
    return target


# --- the conversion -----------------------------------------------------------------------------------------------
def convert_gguf(gguf: Path, out: Path, progress: Progress | None = None,
                 should_stop: StopCheck | None = None) -> None:
    """Dequantize ``gguf`` to a float32 safetensors folder ``out`` (tokenizer included) with transformers; progress
    per tensor; ``should_stop`` polled between tensors (raises ``ConversionStopped``)."""
    say = progress or (lambda message, fraction: None)
    stop = should_stop or (lambda: False)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from playground.models.gguf_reads import gguf_read_once

    name = gguf.name
    say(f"Converting {name}: reading its tokenizer (once; later loads take seconds)…", 0.05)
    try:
        with gguf_read_once(), _tensor_progress(say, stop, name):  # one read of the file for both
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=name, local_files_only=True)
            if stop():
                raise ConversionStopped(f"converting {name} was stopped; nothing was kept")
            say(f"Converting {name}: dequantizing its tensors…", 0.3)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=name, dtype=torch.float32,
                                                         local_files_only=True)
        if stop():
            raise ConversionStopped(f"converting {name} was stopped; nothing was kept")
        say(f"Converting {name}: saving the float model…", 0.9)
        # A GGUF-loaded model refuses save_pretrained while it carries its quantization config.
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        _mark_fast_tokenizer(out, tokenizer)
    except ConversionFailed:
        raise
    except Exception as error:  # gguf-py and transformers raise many kinds on a damaged or unknown file
        text = (str(error).strip() or type(error).__name__).splitlines()[0][:300]
        raise ConversionFailed(f"could not load {gguf.stem} from {gguf.parent} (damaged or unsupported GGUF?): "
                               f"{text}") from error


@contextmanager
def _tensor_progress(say: Progress, stop: Callable[[], bool], name: str) -> Iterator[None]:
    """While inside, transformers' loop over the GGUF's tensors reports each one (0.3 → 0.85 by bytes) and stops
    between tensors when asked (the loop is transformers', wrapped through its module's ``tqdm`` name)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.tqdm

    def reporting(items: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        items = list(items)
        sizes = [int(getattr(item, "n_bytes", 1) or 1) for item in items]
        total, done = max(1, sum(sizes)), 0
        last = float("-inf")  # the first tensor is reported at once (Gemma's embedding: half the file)
        for index, (item, size) in enumerate(zip(items, sizes, strict=True)):
            if stop():
                raise ConversionStopped(f"converting {name} was stopped; nothing was kept")
            yield item
            done += size
            if time.monotonic() - last > 0.25 or done == total:
                last = time.monotonic()
                say(f"Converting {name}: dequantizing tensor {index + 1} of {len(items)}…",
                    0.3 + 0.55 * done / total)

    setattr(gguf_utils, "tqdm", reporting)  # noqa: B010  (the module's name, swapped for the conversion)
    try:
        yield
    finally:
        setattr(gguf_utils, "tqdm", original)  # noqa: B010


# --- the tokenizer, read fast -------------------------------------------------------------------------------------
FAST_TOKENIZER = "playground-tokenizer.json"  # written when the fast read was checked against the full one
PROBE = ("Hello world! The capital of France is Paris.\n\n  indented\ttabs, 12345 3.14 naïve café 日本語 "
         "🙂 <bos><eos><pad> def f(x):\n    return x ** 2\r\n")
_FAST_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token", "sep_token", "cls_token",
              "model_max_length", "chat_template", "padding_side", "truncation_side", "clean_up_tokenization_spaces")


def fast_tokenizer(folder: Path) -> Any | None:
    """The folder's tokenizer read straight from ``tokenizer.json`` by the ``tokenizers`` library, when the
    conversion checked that this gives the same tokenizer (else None: load it the usual way).

    transformers' own read of a 262k-token ``tokenizer.json`` parses it in Python to find its added tokens and
    copies them (2.4 s CPU for Gemma 3 against 0.8 s this way)."""
    marker = folder / FAST_TOKENIZER
    if not marker.is_file() or not (folder / "tokenizer.json").is_file():
        return None
    try:
        kwargs = json.loads(marker.read_text()).get("kwargs", {})
    except (OSError, ValueError):
        return None
    template = folder / "chat_template.jinja"  # where transformers 5 saves a chat template
    if "chat_template" not in kwargs and template.is_file():
        kwargs["chat_template"] = template.read_text()
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    return TokenizersBackend(tokenizer_file=str(folder / "tokenizer.json"), name_or_path=str(folder), **kwargs)


def _same_tokenizer(fast: Any, full: Any) -> bool:
    return (fast.encode(PROBE) == full.encode(PROBE) and len(fast) == len(full)
            and fast.all_special_ids == full.all_special_ids and fast.all_special_tokens == full.all_special_tokens
            and fast.decode(full.encode(PROBE)) == full.decode(full.encode(PROBE))
            and {i: str(t) for i, t in fast.added_tokens_decoder.items()}
            == {i: str(t) for i, t in full.added_tokens_decoder.items()}
            and getattr(fast, "chat_template", None) == getattr(full, "chat_template", None))


def _mark_fast_tokenizer(out: Path, tokenizer: Any) -> None:
    """Mark ``out`` for the fast tokenizer read when that read gives the same tokenizer as ``tokenizer`` (the one
    the conversion made and saved there)."""
    try:
        config = json.loads((out / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return
    kwargs = {key: config[key] for key in _FAST_KEYS if key in config}
    (out / FAST_TOKENIZER).write_text(json.dumps({"kwargs": kwargs}, indent=2))
    try:
        same = _same_tokenizer(fast_tokenizer(out), tokenizer)
    except Exception:  # any failure of the fast read: keep the usual one
        same = False
    if not same:
        (out / FAST_TOKENIZER).unlink()
