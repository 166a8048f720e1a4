"""The steering itself: forward hooks on the anatomy's decoder blocks that add the scaled vectors' sum to each
block's output, at every position (an ActAdd vector: at the sequence's first positions only), as llama.cpp adds
its control vectors (``llama_adapter_cvec::apply_to`` after each layer) and repeng's ``ControlModel`` does.

``SteeringHooks`` is made once per run; ``installed()`` registers the hooks and removes them on the way out (the
run's wrapper, ``playground.engine.steering.run``, holds them for the run's generator, whatever ends it: the end,
Stop, an error, a generator dropped). They act only while ``active()``: while the run's generator computes an
event, so two runs interleaved on one model (side-by-side panes) never see each other's steering.

Target only: a pre-hook on the top-level model notes, at each forward pass, whether the module called is the
target itself. A drafter or amateur made of the target's first layers is a shallow copy that shares its blocks
(and, being a copy, its hook dictionaries): its passes run the blocks unsteered, as llama.cpp steers the target's
context and not the draft's. The jacobi drafter is the target itself and is steered.

The hooks also read what the views show, cheaply (one small product per steered block and pass, no transfer):
each steered block's output (before its own vector is added) projected on each vector's unit direction at the
positions where the step's tokens were predicted (``readings``, from the outputs of the last target pass, held by
reference), and until ``norms_done`` the residual norms per block at the prompt's positions but the first (whose
norm, the attention sink's, is many times the others' and would skew the relative strength), for their median. The
pre-hook re-reads the live strength (a version check); the top-level forward hook checks the logits are finite.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from playground.config.steering import LiveStrength
from playground.engine.steering.vector import SteeringVector
from playground.errors import UserError
from playground.models.anatomy import anatomy_of


class SteeringDiverged(UserError):
    """The steered model's logits were not finite (the strength is too large for the model)."""


class SteeringHooks:
    def __init__(self, model: Any, vectors: Sequence[SteeringVector], strengths: tuple[float, ...],
                 layers: tuple[int, ...], live: LiveStrength | None = None, device: torch.device | None = None
                 ) -> None:
        self.model = model
        self.anatomy = anatomy_of(model)
        self.vectors = list(vectors)
        self.defaults = tuple(strengths)
        self.live = live
        self.layers = layers  # the steered blocks, ascending
        param = next(model.parameters())
        self.dtype = param.dtype
        device = device or param.device
        # per layer: each vector's direction (float32, on the device) or None where it has none there
        self._dirs: dict[int, list[torch.Tensor | None]] = {
            n: [torch.from_numpy(v.directions[n]).to(device) if n in v.directions else None for v in self.vectors]
            for n in layers}
        # [layers, hidden, vectors] float32 unit directions (zeros where a vector has none)
        self._units = torch.stack([torch.stack([torch.from_numpy(v.unit(n)).to(device) if n in v.directions
                                                else torch.zeros(v.hidden_size, device=device)
                                                for v in self.vectors], dim=-1) for n in layers])
        self._front = max((v.front for v in self.vectors), default=0)
        self._version = -1
        self.used: tuple[float, ...] = self._current()
        self._add: dict[int, torch.Tensor | None] = {}
        self._add_front: dict[int, torch.Tensor | None] = {}
        self._build()
        self.enabled = True  # off: the unsteered comparison's passes
        self.is_active = False  # the run's generator is computing (``active()``)
        self.on = False  # the blocks' hooks act: active, enabled, and the pass is the target's
        self.start = 0  # the pass's first position (for ActAdd's front rows)
        # block -> its output [rows, positions, hidden] in the last target pass (steered in place: ``readings``
        # takes the vector off again), and the pass's first position
        self.outputs: dict[int, torch.Tensor] = {}
        self.outputs_start = 0
        self.prompt_len = 0  # the residual norms are measured over the prompt's positions (row 0)
        self.norms_done = False
        self.norm_rows: dict[int, list[torch.Tensor]] = {}  # block -> ‖h‖ at the prompt's positions, per pass
        self.norm_positions = 0

    # -- strengths -------------------------------------------------------------------------------------------------
    def _current(self) -> tuple[float, ...]:
        return self.live.strengths(self.defaults) if self.live is not None else self.defaults

    def _build(self) -> None:
        """Each block's added tensors: sum_v strength_v × direction_v[N] over the plain vectors ([hidden]) and over
        the ActAdd ones ([front, hidden], shorter fronts zero-padded), in the model's dtype (None: nothing)."""
        self._add, self._add_front = {}, {}
        for n in self.layers:
            plain: torch.Tensor | None = None
            front: torch.Tensor | None = None
            for s, d in zip(self.used, self._dirs[n], strict=True):
                if d is None or s == 0.0:
                    continue
                if d.ndim == 1:
                    plain = d * s if plain is None else plain + d * s
                else:
                    rows = torch.cat([d, d.new_zeros(self._front - d.shape[0], d.shape[1])]) * s
                    front = rows if front is None else front + rows
            self._add[n] = plain.to(self.dtype) if plain is not None else None
            self._add_front[n] = front.to(self.dtype) if front is not None else None
        hidden = self.vectors[0].hidden_size
        device = self._units.device
        self._added = torch.stack([a.float() if a is not None else torch.zeros(hidden, device=device)
                                   for a in self._add.values()])  # [layers, hidden]
        self._added_front = torch.stack([a.float() if a is not None else torch.zeros(self._front, hidden, device=device)
                                         for a in self._add_front.values()]) if self._front else None

    def refresh(self) -> None:
        """Re-read the live strength (cheap when it did not change)."""
        if self.live is not None and self.live.version != self._version:
            self._version = self.live.version
            used = self._current()
            if used != self.used:
                self.used = used
                self._build()

    # -- the hooks --------------------------------------------------------------------------------------------------
    def _before_model(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        self.on = self.is_active and self.enabled and module is self.model
        if not self.on:
            return
        self.refresh()
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        self.start = self.outputs_start = int(cache.get_seq_length()) if cache is not None else 0
        self.outputs = {}

    def _after_model(self, module: Any, args: Any, output: Any) -> None:
        if module is not self.model:  # a drafter's pass is over: blocks run by the target's own code act again
            self.on = self.is_active and self.enabled
            return
        if not self.on:
            return
        logits = getattr(output, "logits", None)  # a NaN or an infinity anywhere makes the sum non-finite
        if isinstance(logits, torch.Tensor) and not math.isfinite(float(logits.float().sum())):
            strengths = ", ".join(f"{s:g}" for s in self.used)
            raise SteeringDiverged(f"the steered model's logits are not finite (strength {strengths} on blocks "
                                   f"{self.layers[0]}–{self.layers[-1]}): the strength is too large for this model; "
                                   "lower it")

    def _block_hook(self, n: int):
        def hook(module: Any, args: Any, output: Any) -> None:
            if not self.on:
                return
            h = output[0] if isinstance(output, tuple) else output  # [rows, positions, hidden]
            self.outputs[n] = h  # read (after the step) by ``readings``: no work here
            if not self.norms_done:
                prompt = min(h.shape[1], self.prompt_len - self.start)
                # position 0 (the attention sink, whose norm is many times the others') is left out, unless the
                # prompt is that one position
                skip = 1 if self.start == 0 and self.prompt_len > 1 else 0
                if prompt > skip:
                    self.norm_rows.setdefault(n, []).append(h[0, skip:prompt].float().norm(dim=-1))
                    if n == self.layers[0]:
                        self.norm_positions += prompt - skip
            # In place: the output goes on to the next block (and any later hook) as the steered residual.
            add = self._add[n]
            if add is not None:
                h.add_(add)
            front = self._add_front[n]
            if front is not None and self.start < front.shape[0]:  # ActAdd: front row j at position j only
                rows = front[self.start : self.start + h.shape[1]]
                h[:, : rows.shape[0]].add_(rows)
        return hook

    @contextmanager
    def installed(self) -> Iterator[None]:
        handles = [self.model.register_forward_pre_hook(self._before_model, with_kwargs=True),
                   self.model.register_forward_hook(self._after_model)]
        try:
            for n in self.layers:
                handles.append(self.anatomy.layers[n].register_forward_hook(self._block_hook(n)))
            yield
        finally:
            for handle in handles:
                handle.remove()

    @contextmanager
    def active(self) -> Iterator[None]:
        """The hooks act inside (the target's passes and its blocks run by the strategy's own code)."""
        self.is_active = self.on = True
        try:
            yield
        finally:
            self.is_active = self.on = False

    @contextmanager
    def unsteered(self) -> Iterator[None]:
        """The model's passes inside run without steering (and record nothing): the unsteered comparison."""
        self.enabled = self.on = False
        try:
            yield
        finally:
            self.enabled = True
            self.on = self.is_active

    def readings(self, seen: Sequence[tuple[int, int]]) -> list[list[list[float]]]:
        """[unit][layer][vector]: at each (row, position) of ``seen`` in the last target pass (the step's own: a
        drafter's passes before it are another model's, or the jacobi drafter's before it; greedy's first step: the
        prefill's), each steered block's output before its own vector was added, on each vector's unit direction
        (NaN where the pass did not run a block). One stack, one product and one transfer for the step."""
        outputs, start = self.outputs, self.outputs_start
        if not seen or not outputs:
            return []
        hidden = self.vectors[0].hidden_size
        device = self._units.device
        missing = torch.full((hidden,), float("nan"), device=device)
        states, added = [], []
        for row, position in seen:
            length = next(iter(outputs.values())).shape[1]
            absolute = start + (position if position >= 0 else length + position)
            states.append(torch.stack([outputs[n][row, position].float() if n in outputs else missing
                                       for n in self.layers]))
            take = self._added
            if self._added_front is not None and absolute < self._front:
                take = take + self._added_front[:, absolute]
            added.append(take)
        before = torch.stack(states) - torch.stack(added)  # [units, layers, hidden]
        return torch.einsum("ulh,lhv->ulv", before, self._units).tolist()

    def residual_norms(self) -> tuple[float, ...]:
        """Per steered block, the median ‖h‖ over the prompt's positions after the first (the mean of the two
        middle ones for an even count; 0.0 where none was read): what the relative strength divides by."""
        return tuple(float(torch.cat(self.norm_rows[n]).quantile(0.5)) if n in self.norm_rows else 0.0
                     for n in self.layers)

