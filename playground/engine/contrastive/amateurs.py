"""The amateurs whose opinion contrastive decoding subtracts, behind one small interface.

- ``LayerAmateur``: an early layer of the expert itself (DoLa's contrast of layers): a forward hook keeps that layer's
  output at the newest position during the expert's own pass, and the final norm and LM head turn it into logits
  (the logit lens of ``playground.engine.layers.lens``). No second forward pass, no second KV cache.
- ``DolaAmateur`` (in ``dola``): DoLa's premature layer, chosen per token among candidate layers.
- ``ModelAmateur``: a separate causal LM over the same token ids with its own KV cache: a smaller model of the
  expert's family, or the expert's quantized copy.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers import DynamicCache

from playground.engine.contrastive.scores import Contrast, contrast
from playground.engine.forward import keep_last_logits, prefill_in_chunks
from playground.engine.layers.lens import LayerStack
from playground.engine.run_context import RunContext
from playground.events import PrefillProgress


class Amateur:
    kind = ""
    detail = ""
    layer = 0  # the layer amateur's 1-based layer; 0 for the others

    def __init__(self) -> None:
        self.ms = 0.0  # time of the last ``next_logits``

    def prefill(self, ids: torch.Tensor, context: RunContext
                ) -> Generator[PrefillProgress, None, float | None]:
        """Read ``ids`` [1, n] (the prompt but its last token) before the first step, yielding progress between
        chunks of a long prompt; milliseconds it took, or None when the run's Stop (``context``) came between two
        chunks."""
        return 0.0
        yield  # a generator that reads nothing

    def expert_pass(self) -> AbstractContextManager:
        """Wraps the expert's forward pass of a step (the layer amateur listens to it)."""
        return nullcontext()

    def contrast(self, expert_logits: torch.Tensor, amateur_logits: torch.Tensor, alpha: float,
                 amateur_temperature: float) -> Contrast:
        """One position's contrast of the expert's logits [vocab] (after the penalties) with this amateur's raw
        logits [vocab_a]: the α plausibility cut and log p_expert − log p_amateur (``scores.contrast``)."""
        return contrast(expert_logits, amateur_logits, alpha, amateur_temperature)

    def next_logits(self, ids: torch.Tensor, expert_logits: torch.Tensor | None = None) -> torch.Tensor:
        """The amateur's raw logits [vocab] for the token after ``ids`` [1, n] (the expert has just read them and
        given ``expert_logits`` [vocab], its raw logits: DoLa picks its layer by them)."""
        start = time.perf_counter()
        logits = self._next_logits(ids, expert_logits)
        self.ms = (time.perf_counter() - start) * 1000
        return logits

    def _next_logits(self, ids: torch.Tensor, expert_logits: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError


class LayerAmateur(Amateur):
    kind = "layer"

    def __init__(self, stack: LayerStack, layer: int) -> None:
        super().__init__()
        self.stack = stack
        self.layer = layer  # 1-based
        self.hidden: torch.Tensor | None = None  # [1, hidden]: the layer's output at the newest position
        self.detail = f"layer {layer} of {stack.count} (its output through the final norm and LM head)"

    def expert_pass(self) -> AbstractContextManager:
        return _Tap(self)

    def _next_logits(self, ids: torch.Tensor, expert_logits: torch.Tensor | None = None) -> torch.Tensor:
        assert self.hidden is not None, "the expert's pass did not reach the amateur layer"
        return self.stack.lens_logits(self.hidden)[0]  # norm + LM head in the model's precision: [vocab]


class _Tap:
    """A forward hook on the amateur layer, for the duration of one expert pass."""

    def __init__(self, amateur: LayerAmateur) -> None:
        self.amateur = amateur
        self.handle: RemovableHandle | None = None

    def __enter__(self) -> _Tap:
        def keep(_module: nn.Module, _args: tuple, output: Any) -> None:
            hidden = output[0] if isinstance(output, tuple) else output
            self.amateur.hidden = hidden[0, -1:]  # [1, hidden]

        self.amateur.hidden = None
        self.handle = self.amateur.stack.layers[self.amateur.layer - 1].register_forward_hook(keep)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.handle is not None  # set by __enter__
        self.handle.remove()


class ModelAmateur(Amateur):
    """A causal LM reading the same ids as the expert, one cache of its own."""

    def __init__(self, kind: str, model: nn.Module, detail: str) -> None:
        super().__init__()
        self.kind = kind
        self.model = model
        self.detail = detail
        self.cache = DynamicCache(config=cast(Any, model).config)
        self._extra = keep_last_logits(model, 1)

    def prefill(self, ids: torch.Tensor, context: RunContext
                ) -> Generator[PrefillProgress, None, float | None]:
        start = time.perf_counter()
        if ids.shape[1]:
            for done in prefill_in_chunks(self.model, ids, cache=self.cache):
                if context.stopped():
                    return None
                yield PrefillProgress(done_tokens=done, total_tokens=ids.shape[1])
        return (time.perf_counter() - start) * 1000

    def _next_logits(self, ids: torch.Tensor, expert_logits: torch.Tensor | None = None) -> torch.Tensor:
        feed = ids[:, self.cache.get_seq_length() :]  # what it has not read: the prompt at first, then one token
        out = self.model(input_ids=feed, cache=self.cache, use_cache=True, **self._extra)
        return out.logits[0, -1]

