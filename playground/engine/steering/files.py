"""Steering vector files by their suffix: ``.safetensors`` (ours: ``safetensors_files``) and ``.gguf`` (llama.cpp's
control vectors, the format repeng writes: ``gguf_files``, with ``load_gguf(path) -> SteeringVector`` and
``save_gguf(vector, path) -> Path``)."""

from __future__ import annotations

import importlib
from pathlib import Path

from playground.config.errors import ConfigError
from playground.engine.steering.vector import SteeringVector

SUFFIXES = (".safetensors", ".gguf")


def _gguf(function: str):
    try:
        module = importlib.import_module("playground.engine.steering.gguf_files")
    except ModuleNotFoundError as error:
        if error.name != "playground.engine.steering.gguf_files":
            raise
        raise ConfigError("llama.cpp control-vector files (.gguf) cannot be read or written by this build "
                          "(playground.engine.steering.gguf_files is missing): use a .safetensors file") from None
    return getattr(module, function)


def load_vector(path: str | Path) -> SteeringVector:
    """The vector in ``path`` (by its suffix); ConfigError naming the file when it is missing, damaged, or of
    another kind."""
    path = Path(path).expanduser()
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from playground.engine.steering.safetensors_files import load_safetensors

        return load_safetensors(path)
    if suffix == ".gguf":
        if not path.is_file():
            raise ConfigError(f"steering vector file {path} does not exist")
        vector: SteeringVector = _gguf("load_gguf")(path)
        return vector
    raise ConfigError(f"steering vector file {path}: the suffix must be one of {', '.join(SUFFIXES)} "
                      f"(got {suffix or 'none'})")


def save_vector(vector: SteeringVector, path: str | Path) -> Path:
    """Write ``vector`` as its suffix says; the path written."""
    path = Path(path).expanduser()
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from playground.engine.steering.safetensors_files import save_safetensors

        return save_safetensors(vector, path)
    if suffix == ".gguf":
        written: Path = _gguf("save_gguf")(vector, path)
        return written
    raise ConfigError(f"steering vector file {path}: the suffix must be one of {', '.join(SUFFIXES)} "
                      f"(got {suffix or 'none'})")
