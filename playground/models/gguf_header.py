"""What a ``.gguf`` file holds, read from its header alone: the metadata's scalars, how long its arrays are, and
each tensor's shape and type (so the parameter count and the quantization), without loading a weight.

``gguf.GGUFReader`` builds a numpy view per field part (~300,000 for SmolLM2's vocabulary, seconds); this reads
the same bytes with ``struct`` and skips what a listing never needs (the vocabulary's strings, the merges): on the
default model's 98 MB GGUF it takes milliseconds. tests/test_stores.py checks its figures against
``gguf.GGUFReader`` on small files.

Format (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): magic ``GGUF``, version (u32), tensor count
(u64), metadata count (u64), the metadata (key, value type, value), then per tensor its name, dimension count
(u32), dimensions (u64 each), type (u32) and offset (u64). Little-endian; version 1 files (u32 counts) are refused.
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

from playground.errors import UserError

MAGIC = b"GGUF"

# Metadata value types: type -> struct code (scalars); 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9

# ggml's tensor types (gguf.GGMLQuantizationType) by number, and llama.cpp's file types (gguf.LlamaFileType,
# general.file_type): the names a user knows a quantization by. tests/test_stores.py checks them against gguf's.
TENSOR_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
                11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS",
                18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8",
                25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0",
                39: "MXFP4"}
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
              25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
              32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE"}


class GGUFHeaderError(UserError, ValueError):
    """The file is not a GGUF this reader understands (or is cut short); the message says which and why."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # as the file lists it (ggml order: the fastest-varying dimension first)
    type: int  # ggml's tensor type number

    @property
    def elements(self) -> int:
        return prod(self.shape)

    @property
    def type_name(self) -> str:
        return TENSOR_TYPES.get(self.type, f"type {self.type}")


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]  # scalars and strings as values; an array as ArrayInfo (its type and length)
    tensors: tuple[GGUFTensorInfo, ...] = field(repr=False)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def parameters(self) -> int:
        return sum(t.elements for t in self.tensors)

    @property
    def quantization(self) -> str:
        """``general.file_type``'s name (Q4_K_M, ...), else the type holding most of the weights' elements."""
        file_type = self.metadata.get("general.file_type")
        if isinstance(file_type, int) and file_type in FILE_TYPES:
            return FILE_TYPES[file_type]
        counts: Counter[str] = Counter()
        for tensor in self.tensors:
            counts[tensor.type_name] += tensor.elements
        return counts.most_common(1)[0][0] if counts else "none"

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value; ``{arch}.`` at the start of ``key`` stands for the file's architecture."""
        return self.metadata.get(key.replace("{arch}", self.architecture), default)


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array, not read: its element type and length (a small array of scalars keeps its values)."""

    type: int
    length: int
    values: tuple[Any, ...] | None = None


_SMALL_ARRAY = 64  # arrays of scalars up to this long keep their values (per-layer head counts, ...)


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file that starts with GGUF's magic (Ollama's blobs have no .gguf suffix)."""
    try:
        with path.open("rb") as file:
            return file.read(4) == MAGIC
    except OSError:
        return False


def read_gguf_header(path: Path) -> GGUFHeader:
    """The header of the GGUF at ``path``; ``GGUFHeaderError`` when it is not one or is cut short."""
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return _parse(view, path)
    except (ValueError, OSError) as error:  # an empty file cannot be mapped
        if isinstance(error, GGUFHeaderError):
            raise
        raise GGUFHeaderError(f"{path}: cannot read it as a GGUF file ({error})") from error


def _parse(data: Any, path: Path) -> GGUFHeader:
    unpack = struct.unpack_from
    size = len(data)

    def need(offset: int, count: int) -> None:
        if offset + count > size:
            raise GGUFHeaderError(f"{path}: the GGUF header is cut short (the file ends at byte {size})")

    need(0, 24)
    if data[:4] != MAGIC:
        raise GGUFHeaderError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    version, n_tensors, n_fields = unpack("<IQQ", data, 4)
    if version < 2:
        raise GGUFHeaderError(f"{path}: GGUF version {version} is too old (version 2 or later is read)")
    offset = 24

    def string(at: int) -> tuple[str, int]:
        need(at, 8)
        (length,) = unpack("<Q", data, at)
        need(at + 8, length)
        return bytes(data[at + 8:at + 8 + length]).decode("utf-8", errors="replace"), at + 8 + length

    def value(kind: int, at: int) -> tuple[Any, int]:
        if kind in _SCALARS:
            code = _SCALARS[kind]
            width = struct.calcsize(code)
            need(at, width)
            return unpack("<" + code, data, at)[0], at + width
        if kind == _STRING:
            return string(at)
        if kind == _ARRAY:
            need(at, 12)
            inner, length = unpack("<IQ", data, at)
            at += 12
            if inner in _SCALARS:
                width = struct.calcsize(_SCALARS[inner])
                need(at, width * length)
                values = unpack(f"<{length}{_SCALARS[inner]}", data, at) if length <= _SMALL_ARRAY else None
                return ArrayInfo(inner, length, values), at + width * length
            if inner == _STRING:  # the vocabulary: only the lengths are read, to step over each string
                for _ in range(length):
                    need(at, 8)
                    at += 8 + unpack("<Q", data, at)[0]
                need(0, at)
                return ArrayInfo(inner, length), at
            for _ in range(length):  # arrays of arrays: rare, read element by element
                _, at = value(inner, at)
            return ArrayInfo(inner, length), at
        raise GGUFHeaderError(f"{path}: unknown metadata value type {kind} at byte {at}")

    metadata: dict[str, Any] = {}
    for _ in range(n_fields):
        key, offset = string(offset)
        need(offset, 4)
        (kind,) = unpack("<I", data, offset)
        metadata[key], offset = value(kind, offset + 4)
    tensors = []
    for _ in range(n_tensors):
        name, offset = string(offset)
        need(offset, 4)
        (dims,) = unpack("<I", data, offset)
        need(offset + 4, 8 * dims + 12)
        shape = unpack(f"<{dims}Q", data, offset + 4)
        (kind,) = unpack("<I", data, offset + 4 + 8 * dims)
        offset += 4 + 8 * dims + 12  # and the u64 data offset, unused here
        tensors.append(GGUFTensorInfo(name, tuple(shape), kind))
    return GGUFHeader(version, metadata, tuple(tensors))
