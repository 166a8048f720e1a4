"""Choosing the device (cuda > mps > cpu) and a dtype that suits it."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def available_devices() -> list[str]:
    found = ["cpu"]
    if torch.cuda.is_available():
        found.insert(0, "cuda")
    if mps_available():
        found.insert(0 if "cuda" not in found else 1, "mps")
    return found


def choose_device(requested: str) -> torch.device:
    """``auto`` picks the best present device; asking for an absent one raises ValueError with what is present."""
    present = available_devices()
    if requested == "auto":
        return torch.device(present[0])
    if requested not in present:
        raise ValueError(f"device {requested!r} is not available here; present: {', '.join(present)}")
    return torch.device(requested)


def choose_dtype(requested: str, device: torch.device) -> torch.dtype:
    """``auto``: float32 on CPU (bf16 decodes slower on CPUs), bfloat16 on CUDA where supported, else float16."""
    if requested != "auto":
        return DTYPES[requested]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32
