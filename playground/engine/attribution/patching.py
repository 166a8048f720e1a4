"""Activation patching (causal tracing): clean activations put into the corrupted run, one layer and position at a
time, and the share of the logit difference that comes back.

Both prompts are read once with hooks that keep, per decoder block, the residual stream entering it, its attention
output and its MLP output (the anatomy's output projections, before the residual add). A map's row for block L is
one batched pass with a row per position (only the positions where the two runs' activations differ: patching
any other changes nothing, so its cell is 0 without computing it): the batch starts *at block L* from the
corrupted run's cached state (blocks before L pass their input through untouched, so they cost nothing) and runs
blocks L.. to the logits.
Residual map: row p's state entering L has position p replaced by the clean one. Attention / MLP maps: the state is
the corrupted one, and block L's attention (MLP) output at position p is replaced by the clean output there.
The model's own forward runs around the wrapped blocks (masks, rotary embeddings, final norm, LM head, soft-cap),
so every family of the anatomy table works alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from playground.models.anatomy import Anatomy, anatomy_of
from playground.models.loaded import LoadedModel


@dataclass
class Recorded:
    """One prompt's pass: the last position's logits and, per block, its input and attention/MLP outputs."""

    logits: torch.Tensor  # [vocab]
    resid: list[torch.Tensor]  # per block: [T, d] entering it
    attention: list[torch.Tensor]  # per block: [T, d]
    mlp: list[torch.Tensor]  # per block: [T, d]

    def of(self, kind: str) -> list[torch.Tensor]:
        return {"residual": self.resid, "attention": self.attention, "mlp": self.mlp}[kind]


def _hidden_of(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _first(output: object) -> torch.Tensor:
    return cast(torch.Tensor, output[0] if isinstance(output, tuple) else output)


class Patcher:
    """Runs of one model over prompts of one length: recording, and batched patched passes from a block on."""

    def __init__(self, lm: LoadedModel) -> None:
        self.lm = lm
        self.model = lm.model
        self.anatomy: Anatomy = anatomy_of(lm.model)

    @property
    def layers(self) -> int:
        return self.anatomy.count

    def _forward(self, **inputs: object) -> torch.Tensor:
        out = self.model(**inputs, use_cache=False, logits_to_keep=1)
        return out.logits[:, -1]  # [B, vocab]

    @torch.inference_mode()
    def record(self, ids: Sequence[int]) -> Recorded:
        n = self.layers
        resid: list[torch.Tensor | None] = [None] * n
        attention: list[torch.Tensor | None] = [None] * n
        mlp: list[torch.Tensor | None] = [None] * n
        handles = []

        def keep_input(i: int) -> Callable:
            def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
                resid[i] = _hidden_of(args, kwargs)[0].clone()
            return hook

        def keep_output(store: list, i: int) -> Callable:
            def hook(_m: nn.Module, _args: tuple, output: object) -> None:
                store[i] = _first(output)[0].clone()
            return hook

        for layer in self.anatomy.all_layers():
            handles.append(layer.module.register_forward_pre_hook(keep_input(layer.index), with_kwargs=True))
            handles.append(layer.attention.output.register_forward_hook(keep_output(attention, layer.index)))
            handles.append(layer.mlp.output.register_forward_hook(keep_output(mlp, layer.index)))
        try:
            logits = self._forward(input_ids=torch.tensor([list(ids)], device=self.lm.device))[0]
        finally:
            for handle in handles:
                handle.remove()
        def kept(values: list[torch.Tensor | None]) -> list[torch.Tensor]:
            return [v for v in values if v is not None]
        recorded = Recorded(logits.float(), kept(resid), kept(attention), kept(mlp))
        assert len(recorded.resid) == len(recorded.attention) == len(recorded.mlp) == n, "a block was not seen"
        return recorded

    @contextmanager
    def _from_block(self, start: int, state: torch.Tensor) -> Iterator[None]:
        """For one pass: blocks before ``start`` pass their input through; block ``start`` reads ``state``."""
        layers = [layer.module for layer in self.anatomy.all_layers()]

        def skip(hidden: torch.Tensor | None = None, *args: object, **kwargs: object) -> torch.Tensor:
            return hidden if hidden is not None else cast(torch.Tensor, kwargs["hidden_states"])

        def begin(original: Callable) -> Callable:
            def forward(*args: object, **kwargs: object) -> object:
                if args:
                    return original(state, *args[1:], **kwargs)
                return original(**{**kwargs, "hidden_states": state})
            return forward

        for i, module in enumerate(layers[: start + 1]):
            module.forward = begin(module.forward) if i == start else skip  # an instance attribute shadows it
        try:
            yield
        finally:
            for module in layers[: start + 1]:
                del module.forward

    @torch.inference_mode()
    def run_from(self, start: int, state: torch.Tensor, patch: tuple[nn.Module, torch.Tensor] | None = None
                 ) -> torch.Tensor:
        """Logits [B, vocab] of a pass that starts at block ``start`` from ``state`` [B, T, d]; ``patch``
        (module, values [B, T, d] with NaN where nothing is patched) replaces that module's output where given."""
        handle = None
        if patch is not None:
            module, values = patch
            where = ~torch.isnan(values[..., :1])  # [B, T, 1]

            def replace(_m: nn.Module, _args: tuple, output: object) -> object:
                h = _first(output)
                h = torch.where(where, values.to(h.dtype), h)
                return (h, *output[1:]) if isinstance(output, tuple) else h
            handle = module.register_forward_hook(replace)
        batch, length = state.shape[:2]
        zeros = torch.zeros(batch, length, state.shape[-1], dtype=state.dtype, device=state.device)
        mask = torch.ones(batch, length, dtype=torch.long, device=state.device)
        try:
            with self._from_block(start, state):
                return self._forward(inputs_embeds=zeros, attention_mask=mask).float()
        finally:
            if handle is not None:
                handle.remove()

    def patched_row(self, kind: str, layer: int, clean: Recorded, corrupted: Recorded,
                    positions: Sequence[int] | None = None) -> torch.Tensor:
        """Logits [len(positions), vocab]: a row per position p (every position by default) with ``kind`` at
        block ``layer``, position p, taken from the clean run."""
        source, target = clean.of(kind)[layer], corrupted.of(kind)[layer]  # [T, d]
        length = source.shape[0]
        rows = torch.tensor(list(range(length)) if positions is None else list(positions), device=source.device)
        eye = (torch.arange(length, device=source.device)[None, :] == rows[:, None])[:, :, None]  # [B, T, 1]
        if kind == "residual":
            state = torch.where(eye, source[None], target[None])
            return self.run_from(layer, state)
        values = torch.where(eye, source[None].float(), torch.tensor(float("nan"), device=source.device))
        block = self.anatomy.layer(layer)
        module = block.attention.output if kind == "attention" else block.mlp.output
        state = corrupted.resid[layer][None].expand(len(rows), -1, -1)
        return self.run_from(layer, state, (module, values))


def changed_positions(clean: Recorded, corrupted: Recorded, kind: str, layer: int) -> list[int]:
    """The positions whose activation differs between the two runs: patching any other writes the corrupted
    run's own value back (every position before the first differing token, by causal attention), so its cell is
    0 without a pass."""
    differs = (clean.of(kind)[layer] != corrupted.of(kind)[layer]).any(dim=-1)  # [T]
    return [int(p) for p in torch.nonzero(differs).flatten()]


def logit_diff(logits: torch.Tensor, answer: int, foil: int) -> torch.Tensor:
    return logits[..., answer] - logits[..., foil]


def recovered_share(patched: torch.Tensor, clean: float, corrupted: float) -> torch.Tensor:
    return (patched - corrupted) / (clean - corrupted)


def patch_map_rows(patcher: Patcher, kind: str, clean: Recorded, corrupted: Recorded, answer: int, foil: int
                   ) -> Iterator[tuple[int, list[float], float]]:
    """(layer, recovered share per position, seconds) for every block of one map."""
    clean_diff = float(logit_diff(clean.logits, answer, foil))
    corrupted_diff = float(logit_diff(corrupted.logits, answer, foil))
    for layer in range(patcher.layers):
        start = time.perf_counter()
        share = [0.0] * clean.resid[0].shape[0]
        positions = changed_positions(clean, corrupted, kind, layer)
        if positions:
            logits = patcher.patched_row(kind, layer, clean, corrupted, positions)
            shares = recovered_share(logit_diff(logits, answer, foil), clean_diff, corrupted_diff)
            for p, value in zip(positions, shares.double().cpu().tolist(), strict=True):
                share[p] = float(value)
        yield layer, share, time.perf_counter() - start
