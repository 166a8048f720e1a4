"""``playground models``: the models on this computer as a table (or JSON lines), with the memory each needs at the
chosen dtype against what is free, and which stores were looked at."""

from __future__ import annotations

import json
from pathlib import Path

from playground.models.fit import fast_bf16_cpu, fit_problem, free_memory, free_ram
from playground.models.stores import (
    add_user_folder,
    all_stores,
    entry_row,
    human_bytes,
    remove_user_folder,
    scan,
)

COLUMNS = ("name", "store", "family", "parameters", "quantization", "file")


def resolved_dtype(dtype: str, device: str) -> str:
    """``auto`` as the loader resolves it (``playground.models.device.choose_dtype``) without importing torch for
    the CPU: float32 there, bfloat16 on a CUDA device that has it (float16 otherwise)."""
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float16" if device == "mps" else "float32"


def resolved_device(device: str) -> str:
    if device != "auto":
        return device
    from playground.models.device import choose_device

    return str(choose_device("auto"))


def models_report(*, add: Path | None = None, remove: Path | None = None, dtype: str = "auto",
                  device: str = "cpu", as_json: bool = False) -> str:
    """What ``playground models`` prints."""
    notes = []
    if add is not None:
        notes.append(f"added {add_user_folder(add)}")
    if remove is not None:
        notes.append(f"removed {remove_user_folder(remove)}")
    device = resolved_device(device)
    dtype = resolved_dtype(dtype, device)
    found = scan(all_stores())
    free = free_ram() if device == "cpu" else free_memory(device)
    bf16 = fast_bf16_cpu() if device == "cpu" else None
    rows = []
    for entry in found.entries:
        row = entry_row(entry, dtype)
        row["fits"] = "no" if fit_problem(entry, dtype, free, bf16) else "yes" if free else "?"
        row["problem"] = entry.problem or ""
        rows.append(row)
    if as_json:
        return "\n".join(json.dumps({**row, "file_bytes": e.file_bytes, "parameters_count": e.parameters,
                                     f"memory_bytes_{dtype}": e.memory_bytes(dtype)})
                         for row, e in zip(rows, found.entries, strict=True))
    memory = f"memory ({dtype})"
    columns = (*COLUMNS, memory, "fits", "views")
    widths = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in columns}
    lines = [*notes, "  ".join(c.ljust(widths[c]) for c in columns)]
    for row in rows:
        lines.append("  ".join(row[c].ljust(widths[c]) for c in columns).rstrip())
        lines.append(f"    {row['path']}" + (f"\n    cannot open: {row['problem']}" if row["problem"] else ""))
    if not rows:
        lines.append("(no models found)")
    looked = ", ".join(f"{s.kind} {s.root}{'' if s.root.is_dir() else ' (absent)'}" for s in found.stores)
    lines.append(f"{len(rows)} models in {found.seconds * 1000:.0f} ms; looked in: {looked}")
    if free is not None:
        lines.append(f"free: {human_bytes(free.bytes)} of {free.where}"
                     + (f"; this CPU has fast bfloat16 ({bf16}): --dtype bfloat16 halves the memory" if bf16 else ""))
    lines.extend(f"skipped: {why}" for why in found.skipped)
    return "\n".join(lines)
