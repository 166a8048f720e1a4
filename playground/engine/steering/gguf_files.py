"""llama.cpp control vectors: the GGUF files repeng's ``ControlVector.export_gguf`` writes and llama.cpp's
``--control-vector`` / ``--control-vector-scaled FNAME:SCALE`` read.

The format, as llama.cpp (the copy llama-cpp-python 0.3.36 vendors) reads it in ``common_control_vector_load_one``
(``common/common.cpp``) and applies it in ``llama_adapter_cvec`` (``src/llama-adapter.cpp``):

- one F32 1-D tensor per decoder block, named ``direction.N``; N ≥ 1 (``direction.0`` is refused, and with it the
  whole file: llama.cpp has no tensor for block 0); every other tensor name is refused too;
- ``direction.N`` times the scale is added to the output of the 0-based decoder block N (``build_cvec(cur, il)``
  right after the block's second residual add, ``il`` = N; transformers' ``hidden_states[N + 1]``) at every
  position, the prompt's included; a file's directions for blocks the model lacks (N ≥ its block count) are
  ignored;
- every tensor must be as wide as the model (``n_embd``): the only check against the model;
- ``--control-vector-layer-range START END`` keeps blocks START to END, both inclusive, in the same 0-based
  numbering (default 1 to the block count);
- llama.cpp reads no metadata. repeng writes ``general.architecture`` = "controlvector",
  ``controlvector.model_hint`` (the model's ``config.model_type``, e.g. "llama") and ``controlvector.layer_count``
  (how many directions the file holds, not the model's depth); we write the same, plus our own hints under
  ``playground.*`` (the model's block count and name, the method, the vector's name, ``playground.info.KEY``),
  which other tools ignore.

ActAdd's per-position vectors (``[k, hidden]``) have no place in this format and are refused by name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from playground.config.errors import ConfigError
from playground.engine.steering.vector import SteeringVector

ARCH = "controlvector"
PREFIX = "direction."
OURS = "playground."
_DAMAGE = (ValueError, KeyError, IndexError, TypeError, OverflowError, UnicodeDecodeError, OSError)


def save_gguf(vector: SteeringVector, path: str | Path) -> Path:
    """Write ``vector`` as a llama.cpp control vector; the path. ConfigError for what llama.cpp would not read: no
    direction, a direction for block 0, ActAdd's per-position rows."""
    import gguf

    path = Path(path)
    if not vector.directions:
        raise ConfigError(f"steering vector {vector.label} has no direction to save")
    if vector.front:
        raise ConfigError(f"steering vector {vector.label} adds per-position rows at the first {vector.front} "
                          "positions (ActAdd): a llama.cpp control vector holds one direction per block, added at "
                          "every position. Save it as .safetensors")
    if 0 in vector.directions:
        raise ConfigError(f"steering vector {vector.label} has a direction for block 0, which llama.cpp refuses "
                          "(it never steers the first block, and skips a file naming it): build it without "
                          "block 0, or save it as .safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), ARCH)
    try:
        writer.add_string(f"{ARCH}.model_hint", vector.model_name or "unknown")
        writer.add_uint32(f"{ARCH}.layer_count", len(vector.directions))
        writer.add_uint32(f"{OURS}hidden_size", vector.hidden_size)
        writer.add_uint32(f"{OURS}layer_count", vector.layer_count)
        for key, value in (("model_name", vector.model_name), ("method", vector.method), ("name", vector.name)):
            if value:
                writer.add_string(f"{OURS}{key}", value)
        for key, value in vector.info.items():
            writer.add_string(f"{OURS}info.{key}", str(value))
        for n, direction in vector.directions.items():
            writer.add_tensor(f"{PREFIX}{n}", np.ascontiguousarray(direction, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(partial, path)  # a half-written file never carries the name
    return path


def load_gguf(path: str | Path) -> SteeringVector:
    """The control vector in ``path``; ConfigError naming the file when it is missing, damaged, or holds what
    llama.cpp would refuse (another tensor, ``direction.0``, a non-F32 or non-1-D tensor, mixed widths)."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"steering vector file {path} does not exist")
    try:
        reader = gguf.GGUFReader(str(path))
        fields = {name: _value(field) for name, field in reader.fields.items()}
        tensors = [(t.name, t.tensor_type, [int(x) for x in t.shape], np.array(t.data)) for t in reader.tensors]
        del reader  # its memory map closes with it (the data were copied)
    except _DAMAGE as error:
        raise ConfigError(f"steering vector file {path} is damaged or not a GGUF file: {error}") from None
    arch = fields.get("general.architecture")
    if arch is not None and arch != ARCH:
        raise ConfigError(f"steering vector file {path} is a GGUF of architecture {arch!r} (a model?), not a "
                          f"llama.cpp control vector ({ARCH!r})")
    directions: dict[int, np.ndarray] = {}
    for name, kind, dims, data in tensors:
        index = name[len(PREFIX):]
        if not name.startswith(PREFIX) or not index.isdigit():
            raise ConfigError(f"steering vector file {path}: tensor {name!r} is not named direction.N (llama.cpp "
                              "refuses the file)")
        n = int(index)
        if n == 0:
            raise ConfigError(f"steering vector file {path}: tensor {name} is for block 0, which llama.cpp refuses "
                              "(its control vectors start at block 1)")
        if kind != gguf.GGMLQuantizationType.F32:
            raise ConfigError(f"steering vector file {path}: tensor {name} is {kind.name}, not F32")
        if _ggml_dims(dims) != 1:
            raise ConfigError(f"steering vector file {path}: tensor {name} has shape {dims}, not 1-D")
        directions[n] = data.reshape(-1).astype(np.float32)
    if not directions:
        raise ConfigError(f"steering vector file {path} holds no direction.N tensors")
    widths = {n: d.shape[0] for n, d in directions.items()}
    if len(set(widths.values())) > 1:
        listed = ", ".join(f"direction.{n}: {w}" for n, w in widths.items())
        raise ConfigError(f"steering vector file {path}: its directions differ in width ({listed})")
    width = next(iter(widths.values()))
    hidden = _number(fields.get(f"{OURS}hidden_size"), width)
    info = {k[len(OURS) + 5:]: str(v) for k, v in fields.items() if k.startswith(f"{OURS}info.")}
    hint = fields.get(f"{ARCH}.model_hint")
    try:
        return SteeringVector(directions, hidden_size=hidden, layer_count=_number(fields.get(f"{OURS}layer_count"), 0),
                              model_name=str(fields.get(f"{OURS}model_name") or hint or ""),
                              method=str(fields.get(f"{OURS}method") or ""),
                              name=str(fields.get(f"{OURS}name") or path.stem), info=info)
    except ConfigError as error:
        raise ConfigError(f"steering vector file {path}: {error}") from None


def _value(field: Any) -> Any:
    """A metadata field's value (a string, a number, or a list of them), as gguf-py reads it."""
    value = field.contents()
    return value.item() if isinstance(value, np.generic) else value


def _number(value: Any, default: int) -> int:
    return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else default


def _ggml_dims(dims: list[int]) -> int:
    """ggml's ``ggml_n_dims``: trailing sizes of 1 do not count ([576, 1] is 1-D), at least 1."""
    count = len(dims)
    while count > 1 and dims[count - 1] == 1:
        count -= 1
    return max(count, 1)
