"""Steering vectors as safetensors files: one float32 tensor per block, named as llama.cpp's GGUF names them
(``direction.N``, N the 0-based decoder block), and the model hints in the file's string metadata.

Metadata keys: ``format`` = "playground-steering", ``hidden_size``, ``layer_count``, ``model_name``, ``method``,
``name``, and ``info.KEY`` for free-form provenance. A file without our metadata (tensors ``direction.N`` only)
still reads: its width is the tensors'."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from playground.config.errors import ConfigError
from playground.engine.steering.vector import SteeringVector

FORMAT = "playground-steering"
PREFIX = "direction."


def save_safetensors(vector: SteeringVector, path: str | Path) -> Path:
    from safetensors.numpy import save_file

    path = Path(path)
    if not vector.directions:
        raise ConfigError(f"steering vector {vector.label} has no direction to save")
    tensors = {f"{PREFIX}{n}": np.ascontiguousarray(d, dtype=np.float32) for n, d in vector.directions.items()}
    meta = {"format": FORMAT, "hidden_size": str(vector.hidden_size), "layer_count": str(vector.layer_count),
            "model_name": vector.model_name, "method": vector.method, "name": vector.name,
            **{f"info.{k}": str(v) for k, v in vector.info.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta)
    return path


def load_safetensors(path: str | Path) -> SteeringVector:
    """The vector in ``path``; ConfigError naming the file when it is missing, damaged or holds no directions."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"steering vector file {path} does not exist")
    try:
        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
            names = f.keys()  # (the handle itself is not iterable)
            tensors = {name: f.get_tensor(name) for name in names}
    except (SafetensorError, OSError, ValueError, json.JSONDecodeError) as error:
        raise ConfigError(f"steering vector file {path} is damaged or not a safetensors file: {error}") from None
    directions: dict[int, np.ndarray] = {}
    for name, tensor in tensors.items():
        if not name.startswith(PREFIX) or not name[len(PREFIX):].isdigit():
            continue
        if tensor.dtype.kind != "f" or tensor.ndim not in (1, 2):
            raise ConfigError(f"steering vector file {path}: tensor {name} is {tensor.dtype} {list(tensor.shape)}, "
                              "not a float [hidden] or [positions, hidden] direction")
        directions[int(name[len(PREFIX):])] = tensor.astype(np.float32)
    if not directions:
        raise ConfigError(f"steering vector file {path} holds no direction.N tensors (found: "
                          f"{', '.join(sorted(tensors)) or 'none'})")
    width = int(next(iter(directions.values())).shape[-1])
    try:
        hidden = int(meta["hidden_size"]) if "hidden_size" in meta else width
        layers = int(meta.get("layer_count") or 0)
    except ValueError:
        raise ConfigError(f"steering vector file {path}: its hidden_size / layer_count metadata are not "
                          "numbers") from None
    info = {k[len("info."):]: v for k, v in meta.items() if k.startswith("info.")}
    try:
        return SteeringVector(directions, hidden_size=hidden, layer_count=layers,
                              model_name=meta.get("model_name", ""), method=meta.get("method", ""),
                              name=meta.get("name", "") or path.stem, info=info)
    except ConfigError as error:
        raise ConfigError(f"steering vector file {path}: {error}") from None
