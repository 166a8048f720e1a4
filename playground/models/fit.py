"""Whether a model fits before it is loaded: its weights at the chosen dtype (from config.json and the safetensors
headers, or the GGUF header: ``playground.models.stores``) against the memory free on the device (RAM:
``MemAvailable`` of /proc/meminfo; a GPU: ``torch.cuda.mem_get_info``). A model that does not fit is refused with
both figures before any weight is read or converted.

Also whether this CPU has fast bfloat16 (``avx512_bf16`` or AMX in /proc/cpuinfo): there bfloat16 halves the
memory at little cost in speed, and the refusal and the picker offer it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from playground.errors import UserError
from playground.models.stores import DTYPE_BYTES, StoreEntry, describe, human_bytes, human_count


class ModelDoesNotFit(UserError, ValueError):
    """The model's weights at the chosen dtype need more memory than is free; the message gives the figures."""


@dataclass(frozen=True)
class FreeMemory:
    bytes: int
    where: str  # "RAM (MemAvailable)", "cuda:0 (free of 80 GB)"


def fast_bf16_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU feature that makes bfloat16 fast here (``avx512_bf16``, ``amx_bf16``), or None."""
    try:
        with cpuinfo.open() as file:
            for line in file:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    for flag in ("amx_bf16", "avx512_bf16"):
                        if flag in flags:
                            return flag
                    return None
    except OSError:
        return None
    return None


def free_ram(meminfo: Path = Path("/proc/meminfo")) -> FreeMemory | None:
    """The RAM the kernel says can be given to a new program without swapping, or None where unknown."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return FreeMemory(int(line.split()[1]) * 1024, "RAM (MemAvailable)")
    except (OSError, ValueError, IndexError):
        pass
    try:  # other Unixes: free pages only (a lower bound: the page cache is not counted)
        return FreeMemory(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "RAM (free pages)")
    except (ValueError, OSError, AttributeError):
        return None


def free_memory(device: str) -> FreeMemory | None:
    """What is free where the weights will live: a CUDA device's memory, else RAM (MPS shares it)."""
    if device.startswith("cuda"):
        import torch

        free, total = torch.cuda.mem_get_info(torch.device(device))
        return FreeMemory(int(free), f"{device} (free of {human_bytes(int(total))})")
    return free_ram()


def fit_problem(entry: StoreEntry, dtype: str, free: FreeMemory | None, bf16_flag: str | None) -> str | None:
    """Why ``entry``'s weights at ``dtype`` do not fit in ``free`` (the message), or None where they fit."""
    need = entry.memory_bytes(dtype)
    if need is None or free is None or need <= free.bytes:
        return None
    size = DTYPE_BYTES[dtype]
    message = (f"{entry.name} does not fit: its {human_count(entry.parameters, entry.parameters_estimated)} "
               f"parameters at {dtype} ({size} bytes each) need {human_bytes(need)} for the weights alone, and "
               f"{human_bytes(free.bytes)} of {free.where} is free.")
    half = entry.memory_bytes("bfloat16")
    if size > 2 and half is not None and half <= free.bytes:
        why = f"fast on this CPU: {bf16_flag}" if bf16_flag else "but slower than float32 on this CPU"
        message += f" At bfloat16 it needs {human_bytes(half)} and would fit ({why})."
    else:
        message += " Close other programs, or pick a smaller model or a device with more memory."
    return message


def check_fits(path: Path, dtype: str, device: str) -> StoreEntry | None:
    """Refuse (``ModelDoesNotFit``) a model folder or GGUF whose weights at ``dtype`` exceed the free memory on
    ``device``; the model's description when it was read (None where it could not be: the load says why)."""
    try:
        entry = describe(path)
    except (OSError, ValueError):  # unreadable here: the loader's own error says it better
        return None
    bf16 = fast_bf16_cpu() if device == "cpu" else None
    # On a GPU the weights pass through RAM first (loaded there, then moved): both must hold them.
    for free in ([free_ram(), free_memory(device)] if device.startswith("cuda") else [free_memory(device)]):
        problem = fit_problem(entry, dtype, free, bf16)
        if problem:
            raise ModelDoesNotFit(problem)
    return entry
