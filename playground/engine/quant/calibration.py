"""Calibration text and the activations it produces: one forward pass with hooks on every decoder projection (the
anatomy's, by full module name: ``model.layers.3.mlp.up_proj``, ``transformer.h.0.attn.c_attn``).

The texts live in ``resources/calibration/`` (public domain; calibration and evaluation held apart).
``activation_stats`` gives, per linear, the per-input-channel max |x| (what SmoothQuant needs) and mean |x|
(what AWQ needs); ``capture_inputs`` keeps the inputs themselves (AWQ's search replays them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from playground.engine.quant.targets import decoder_linears as decoder_linears  # re-exported: by full name
from playground.models.anatomy import anatomy_of
from playground.resources import RESOURCES_DIR

CALIBRATION_DIR = RESOURCES_DIR / "calibration"


def load_text(name: str) -> str:
    """A text from ``resources/calibration/``: ``"calibration"`` or ``"evaluation"`` (or any file stem there)."""
    path = CALIBRATION_DIR / f"{name}.txt"
    if not path.is_file():
        known = sorted(p.stem for p in CALIBRATION_DIR.glob("*.txt"))
        raise FileNotFoundError(f"no calibration text named {name!r}; known: {', '.join(known)}")
    return path.read_text(encoding="utf-8")


def text_ids(tokenizer: Any, text: str, max_tokens: int) -> list[int]:
    """The first ``max_tokens`` token ids of ``text`` (the tokenizer's own special tokens, if it adds any)."""
    ids = tokenizer(text)["input_ids"]
    return list(ids[:max_tokens])


def decoder_layers(model: Any) -> list[Any]:
    return list(anatomy_of(model).layers)


@dataclass(frozen=True)
class ActivationStats:
    """Per-input-channel statistics of |x| over the calibration tokens: ``max_abs`` and ``mean_abs`` are [in]."""

    max_abs: torch.Tensor
    mean_abs: torch.Tensor
    tokens: int


def _run_with_hooks(model: Any, ids: list[int], on_input, names: set[str] | None = None) -> None:
    """One teacher-forced pass over ``ids`` calling ``on_input(name, x [tokens, in])`` for every decoder linear
    (or those in ``names``)."""
    handles = []
    for name, module in decoder_linears(model).items():
        if names is not None and name not in names:
            continue
        def hook(_module, args, _name=name):
            x = args[0]
            on_input(_name, x.detach().reshape(-1, x.shape[-1]).float())
        handles.append(module.register_forward_pre_hook(hook))
    try:
        device = next(model.parameters()).device
        with torch.inference_mode():
            model(input_ids=torch.tensor([ids], device=device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()


def activation_stats(model: Any, tokenizer: Any, text: str, max_tokens: int = 512) -> dict[str, ActivationStats]:
    """Per-input-channel max |x| and mean |x| of every decoder linear's input, from one pass over ``text``."""
    ids = text_ids(tokenizer, text, max_tokens)
    stats: dict[str, ActivationStats] = {}

    def record(name: str, x: torch.Tensor) -> None:
        a = x.abs()  # [tokens, in]
        stats[name] = ActivationStats(max_abs=a.amax(dim=0).cpu(), mean_abs=a.mean(dim=0).cpu(), tokens=a.shape[0])

    _run_with_hooks(model, ids, record)
    return stats


def capture_inputs(model: Any, ids: list[int], names: set[str] | None = None) -> dict[str, torch.Tensor]:
    """The input [tokens, in] (float32, CPU) of every decoder linear (or those in ``names``) on one pass."""
    inputs: dict[str, torch.Tensor] = {}
    _run_with_hooks(model, ids, lambda name, x: inputs.__setitem__(name, x.cpu().clone()), names)
    return inputs
