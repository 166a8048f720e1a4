"""The ``kv-cache`` strategy: greedy decoding that measures its KV cache after every step.

The cache is held as one growing tensor per layer (transformers' DynamicCache), as fixed-size blocks with a block
table (``--paged``), quantized (``--kv-dtype int4|int2``: KIVI's; ``int8|int4-per-token``: per-token codes,
contiguous or paged), or not at all (``--no-cache``: the whole sequence is
recomputed every step). Every step yields a ``KVStep`` (per-layer bytes measured from the tensors, the formula,
process memory, the block tables) before its ``token`` event; the prefill and the decode phase each get a
``KVPhase`` on the roofline of this machine's measured ceilings; with and without cache latency and a batch sweep
are measured at the end when asked. The prompt is read as every strategy reads it, in chunks with progress and Stop
between them, into whichever holder the run uses (without a cache, in one pass).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Generator, Iterator
from contextlib import ExitStack, contextmanager

import torch
from transformers import Cache, DynamicCache, PreTrainedModel

from playground.config import ConfigError, KVSettings, RunSettings
from playground.config.kv import PER_TOKEN_DTYPES
from playground.engine.baseline import plain_greedy
from playground.engine.decode import DecodeLoop, Picked
from playground.engine.forward import sync_device
from playground.engine.kv import compressed_run, measure
from playground.engine.kv_cache import kv_formula_bytes
from playground.engine.processors import build_pipeline, run_pipeline
from playground.engine.prompt import check_fits_context, encode_prompt
from playground.engine.run_context import NO_CONTEXT, RunContext, StopCheck
from playground.engine.run_events import RunRecorder
from playground.engine.sampling import make_generator, sample_next_token
from playground.engine.step_analysis import analyse_step
from playground.engine.token_text import TokenTextCache
from playground.events import Event, PrefillDone
from playground.events.figures import agreement_figures
from playground.events.kv import KVCompare, KVPhase, KVStarted, KVStep, KVSweep
from playground.models.anatomy import family_name, kv_layout
from playground.models.loaded import LoadedModel

ELEMENT_BYTES = {"int8": 1.0, "int4-per-token": 0.5, "int4": 0.5, "int2": 0.25}


def run_kv_cache(lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None = None
                 ) -> Iterator[Event]:
    settings.validate()
    kv = settings.group(KVSettings)
    check_attention(lm, kv)
    prompt_ids, prompt_text = encode_prompt(lm, settings)
    check_fits_context(lm, len(prompt_ids) + len(settings.forced_token_ids), settings)
    record = RunRecorder(lm, settings, context, groups=(KVSettings,))
    return _decode(lm, settings, kv, prompt_ids, prompt_text, record)


def new_cache(lm: LoadedModel, kv: KVSettings) -> Cache | None:
    """The cache the settings ask for (None: no cache)."""
    if kv.no_cache:
        return None
    if kv.compressed():  # sinks + window, heavy hitters, KIVI
        return compressed_run.new_compressed_cache(lm, kv)
    if kv.paged:
        from playground.engine.kv.paged import PagedCache, prefix_pool

        dtype = PER_TOKEN_DTYPES.get(kv.kv_dtype, "model")
        shared = prefix_pool(lm.model, kv.block_size, dtype, kv.prefix_blocks) if kv.prefix_blocks else None
        return PagedCache(lm.model.config, block_size=kv.block_size, kv_dtype=dtype, prefix_pool=shared)
    if kv.kv_dtype != "model":
        from playground.engine.kv.quantized import QuantizedKVCache

        return QuantizedKVCache(lm.model.config, kv_dtype=PER_TOKEN_DTYPES[kv.kv_dtype])
    return DynamicCache(config=lm.model.config)


def check_attention(lm: LoadedModel, kv: KVSettings) -> None:
    """``ConfigError`` (before the first event) when the model's family cannot run the attention asked for:
    transformers gives Gemma 2 no SDPA attention (it soft-caps the attention scores, which PyTorch's
    ``scaled_dot_product_attention`` cannot), so ``--attn sdpa`` there would fail inside the first forward pass.
    Every cache (contiguous, paged, quantized) runs under the model's own attention, eager included."""
    model = lm.model
    if kv.attn != "sdpa" or model.config._attn_implementation == "sdpa" or getattr(model, "_supports_sdpa", True):
        return
    softcap = getattr(model.config.get_text_config(decoder=True), "attn_logit_softcapping", None)
    why = (f"its attention soft-caps the scores (attn_logit_softcapping={softcap:g}), which PyTorch's "
           f"scaled_dot_product_attention cannot do" if softcap else "transformers has no SDPA attention for it")
    raise ConfigError(f"{family_name(model)} ({type(model).__name__}) cannot run SDPA attention: {why}. Use "
                      f"--attn eager, or --attn model to keep its own ({model.config._attn_implementation})")


def attention_used(model: PreTrainedModel, asked: str) -> str:
    """The implementation a run uses: the one asked for, or the model's own for "model"."""
    return model.config._attn_implementation if asked == "model" else asked


@contextmanager
def attention(model: PreTrainedModel, implementation: str) -> Iterator[None]:
    """The model's attention switched to ``implementation`` for the run ("model": left as it is), and back after."""
    before = model.config._attn_implementation
    if implementation in (before, "model"):
        yield
        return
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def kv_started(lm: LoadedModel, kv: KVSettings, max_length: int) -> KVStarted:
    """What the run holds its cache in, with the formula's numbers and this machine's ceilings.

    ``formula_bytes_per_token`` is what one token costs while every layer holds every token: on a model with
    sliding-window layers that is only until the sequence passes the window; each ``KVStep``'s ``formula_bytes``
    counts every layer by its type (``kv_cache.kv_formula_bytes``)."""
    layout = kv_layout(lm.model.config)
    element = ELEMENT_BYTES.get(kv.kv_dtype, float(torch.empty((), dtype=lm.dtype).element_size()))
    ceilings = measure.machine_ceilings(lm.device)
    holder = "none" if kv.no_cache else ("paged" if kv.paged else "contiguous")
    return KVStarted(
        holder=holder, block_size=kv.block_size if kv.paged else 0, kv_dtype=kv.kv_dtype,
        attn=attention_used(lm.model, kv.attn), layers=layout.count, kv_heads=layout.kv_heads,
        head_dim=layout.head_dim, bytes_per_element=element,
        formula_bytes_per_token=2 * layout.count * layout.kv_heads * layout.head_dim * element,
        weights_bytes=measure.weights_bytes(lm.model), max_length=max_length, peak_flops=ceilings.peak_flops,
        peak_bytes_per_s=ceilings.peak_bytes_per_s, sequences=kv.samples, keep=kv.kv_keep,
        sinks=kv.kv_sinks if kv.kv_keep == "sinks" else 0, window=kv.kv_window if kv.kv_keep != "all" else 0,
        budget=kv.kv_budget if kv.kv_keep == "h2o" else 0,
        kivi_group=kv.kivi_group if kv.kivi() else 0, kivi_residual=kv.kivi_residual if kv.kivi() else 0)


def kv_step(lm: LoadedModel, cache: object | None, step: int, tokens: int, start: KVStarted,
            evicted: tuple[int, ...] = ()) -> KVStep:
    layers = cache_layer_bytes(cache, start.layers)
    if hasattr(cache, "held_tokens"):  # a cache that evicts holds fewer positions than the sequence has
        tokens = cache.held_tokens()
    process, reserved = measure.process_memory(lm.device)
    blocks = cache.blocks() if hasattr(cache, "blocks") else None
    sequences = start.sequences if cache is not None else 0
    formula = kv_formula_bytes(lm.model.config, tokens, start.bytes_per_element, sequences)
    return KVStep(step=step, tokens=tokens if cache is not None else 0, layer_bytes=tuple(layers),
                  total_bytes=sum(layers), formula_bytes=formula, process_bytes=process,
                  device_reserved_bytes=reserved, blocks=blocks, evicted=evicted)


def cache_layer_bytes(cache: object | None, layers: int) -> list[int]:
    if cache is None:
        return [0] * layers
    if hasattr(cache, "layer_bytes"):
        return list(cache.layer_bytes())
    return measure.layer_bytes(cache)


def _decode(lm: LoadedModel, settings: RunSettings, kv: KVSettings, prompt_ids: list[int], prompt_text: str,
            record: RunRecorder) -> Iterator[Event]:
    samples = kv.samples
    pipeline = build_pipeline(settings, sampling=samples > 1, tokenizer=lm.tokenizer)
    generator = make_generator(lm.device, settings.seed)
    token_text = TokenTextCache(lm.tokenizer)
    forced = settings.forced_token_ids
    model = lm.model
    loop = DecodeLoop(lm, settings, record, prompt_ids, prompt_text)
    rows = loop.ids  # [samples, ·]: row 0 is the run's own sequence, the others its parallel samples
    step_ms: list[float] = []
    logits: torch.Tensor | None = None
    logprobs: list[torch.Tensor] = []  # compressed caches: each step's raw log-probabilities, for the quality
    evictions = compressed_run.EvictionTracker()

    def step(index: int, forced_id: int | None) -> Picked:
        nonlocal logits
        ids = rows.view
        if index > 0:
            if cache is None:  # recompute everything: the cost the cache saves
                logits = model(input_ids=ids, use_cache=False, **_last_only(model)).logits[:, -1, :].float()
            else:
                logits = model(input_ids=ids[:, -1:], cache=cache, use_cache=True).logits[:, -1, :].float()
        # logits: [samples, vocab]; the run's own tokens are row 0's, the other rows are its parallel samples
        assert logits is not None  # the prefill's, or this step's
        analysis = analyse_step(pipeline, ids[:1], logits[:1], settings.num_candidates)
        if forced_id is not None:
            token_id = forced_id
        elif samples > 1:
            token_id = sample_next_token(analysis.processed_probs, generator)
        else:
            token_id = int(analysis.processed_logits.argmax(dim=-1).item())
        analysis.token_id = token_id
        row_tokens = [token_id] + [_sample_row(pipeline, ids[r : r + 1], logits[r : r + 1], generator)
                                   for r in range(1, samples)]
        if samples > 1:
            rows.append(row_tokens)  # every row's token (a single sequence is the loop's own buffer)

        if kv.compressed():
            logprobs.append(logits[0].log_softmax(dim=-1).cpu())

        def events(texts: list[str], ms: float) -> list[Event]:
            step_ms.append(ms)
            held_now = kv_step(lm, cache, index, rows.length - 1, start,  # measured outside the step's time
                               evictions.newly_evicted(cache))
            token = analysis.to_event(step=index, text=texts[0], forced=forced_id is not None, step_ms=ms,
                                      kv_bytes=held_now.total_bytes, token_text=token_text)
            return [held_now, token]  # the observers' (the attention row) come before the token

        return Picked([token_id], events)

    yield loop.started()
    start = kv_started(lm, kv, len(prompt_ids) + loop.max_steps)
    yield start
    yield from loop.opening()  # the observers' start events (the attention recording's)
    with ExitStack() as scope:
        scope.enter_context(attention(model, kv.attn))
        scope.enter_context(torch.inference_mode())
        loop.cache = cache = new_cache(lm, kv)  # the observers read it (the attention rows: which keys it holds)
        tap = compressed_run.attention_tap(kv, cache)
        scope.enter_context(compressed_run.tapping(model, tap))
        # A paged cache on a shared pool takes the prompt's blocks another run wrote: read only the rest.
        reused = cache.share_prefix(prompt_ids) if cache is not None and hasattr(cache, "share_prefix") else 0
        logits = yield from _prefill(lm, record, start, loop.ids.view[:, reused:], cache)  # [1, vocab]
        if logits is None:  # Stop between two chunks of the prompt
            loop.stop_reason = "stopped"
        else:
            if samples > 1:  # the prompt read once, its cache shared by every sequence (paged: the same blocks)
                if cache is not None:
                    cache.batch_repeat_interleave(samples)
                rows = loop.ids.repeated(samples)
                logits = logits.repeat(samples, 1)  # [samples, vocab]
            yield from loop.steps(step)
        generated = loop.generated
        if len(generated) > 1:  # the first token came from the prefill's logits: one pass fewer than tokens
            yield _phase(lm, start, "decode", len(generated) - 1, len(prompt_ids) + len(generated) - 1,
                         sum(step_ms[1:]), recompute=cache is None)
    stop_reason = loop.stop_reason

    # The measurements after the run poll Stop too: one Stop cut short, or skipped, is named in the final event.
    figures: dict[str, float] | None = {}
    cut_short: list[str] = []
    after = RunContext(should_stop=lambda: True) if stop_reason == "stopped" else record.context
    if generated and kv.compare_no_cache:
        compared = _compare(lm, prompt_ids, len(generated), after)
        if compared is None:
            cut_short.append("no_cache")
        else:
            yield compared
    if generated and kv.sweep_sizes():
        # At least two tokens, so one step follows the prefill: the sweep times steps, and decodes past EOS
        # anyway, so an answer that ended at its first token still gets one.
        sweep = _sweep(lm, prompt_ids, kv.sweep_sizes(), max(2, min(len(generated), 32)), after)
        if len(sweep.batch_sizes) < len(kv.sweep_sizes()):
            cut_short.append("batch_sweep")
        if sweep.batch_sizes:  # the sizes measured in full before Stop
            yield sweep
    if generated and (kv.kv_dtype != "model" or kv.compressed()) and samples == 1 and not forced:
        figures = _divergence(lm, settings, prompt_ids, generated, after)
        if figures is None:
            cut_short.append("full_model")
        elif kv.compressed() and len(logprobs) == len(generated):
            yield compressed_run.kv_quality(lm, prompt_ids, generated, logprobs, int(figures["first_divergence"]))
    if cut_short:
        stop_reason = "stopped"
    loop.stop_reason, loop.cut_short = stop_reason, tuple(cut_short)
    yield loop.finished(figures or {})


def _prefill(lm: LoadedModel, record: RunRecorder, start: KVStarted, ids: torch.Tensor, cache: object | None
             ) -> Generator[Event, None, torch.Tensor | None]:
    """The prompt ``ids`` [1, n] into ``cache`` in chunks, as every strategy reads it (``RunRecorder.prefill``:
    progress and Stop between chunks, the same for contiguous, paged and quantized holders), or in one pass without
    a cache (nothing to read it into in parts). The prefill's phase on the roofline comes just before PrefillDone.
    Returns the last logits [1, vocab] float32, or None when Stop came between two chunks."""
    tokens = ids.shape[1]
    if cache is None:
        begin = time.perf_counter()
        logits = lm.model(input_ids=ids, use_cache=False, **_last_only(lm.model)).logits[:, -1, :].float()
        sync_device(lm.device)
        record.prefill_ms = (time.perf_counter() - begin) * 1000
        yield _phase(lm, start, "prefill", tokens, tokens, record.prefill_ms)
        yield PrefillDone(prompt_tokens=tokens, prefill_ms=record.prefill_ms, kv_cache_bytes=0)
        return logits
    reading = record.prefill(ids, cache=cache)
    while True:
        try:
            event = next(reading)
        except StopIteration as end:
            return None if end.value is None else end.value[0].float()
        if isinstance(event, PrefillDone):  # the bytes as the KV steps measure them, per layer
            yield _phase(lm, start, "prefill", tokens, tokens, record.prefill_ms)
            event = dataclasses.replace(event, kv_cache_bytes=sum(cache_layer_bytes(cache, start.layers)))
        yield event


def _divergence(lm: LoadedModel, settings: RunSettings, prompt_ids: list[int], generated: list[int],
                context: RunContext = NO_CONTEXT) -> dict[str, float] | None:
    """Where a quantized cache's greedy output first leaves the full-precision cache's (−1: nowhere); None when
    Stop cut the full-precision decode short."""
    full, _ = plain_greedy(lm, settings, prompt_ids, len(generated), context)
    return agreement_figures(generated, full) if len(full) == len(generated) else None


def _sample_row(pipeline: tuple, ids: torch.Tensor, logits: torch.Tensor, generator: torch.Generator) -> int:
    """One parallel sample's next token: ``ids`` [1, n], ``logits`` [1, vocab]."""
    return sample_next_token(run_pipeline(pipeline, ids, logits).softmax(dim=-1), generator)


def _last_only(model: torch.nn.Module) -> dict:
    from playground.engine.forward import keep_last_logits

    return keep_last_logits(model, 1)


def _phase(lm: LoadedModel, start: KVStarted, phase: str, tokens: int, context: int, ms: float,
           recompute: bool = False) -> KVPhase:
    """``tokens``: prompt tokens read (prefill) or forward passes (decode); ``context``: the length at the end."""
    body, head = measure.forward_params(lm.model)
    flops, moved = measure.phase_estimate(
        lm.model.config, body, phase, tokens, context, start.weights_bytes / max(measure.parameter_count(lm.model), 1),
        start.formula_bytes_per_token, head_params=head, recompute=recompute)
    seconds = ms / 1000
    return KVPhase(phase=phase, tokens=tokens, ms=ms, flops=flops, bytes_moved=moved,
                   intensity=flops / moved if moved else 0.0, achieved_flops=flops / seconds if seconds else 0.0)


def _compare(lm: LoadedModel, prompt_ids: list[int], tokens: int, context: RunContext = NO_CONTEXT
             ) -> KVCompare | None:
    """The same tokens decoded with and without a cache, each step timed; None when Stop cut either short."""
    from playground.engine.kv.batch import cached_decode, no_cache_decode

    cached_ids, cached_ms = cached_decode(lm, prompt_ids, tokens, context=context)
    uncached_ids, uncached_ms = no_cache_decode(lm, prompt_ids, tokens, context=context)
    if min(len(cached_ids), len(uncached_ids)) < tokens:
        return None
    return KVCompare(cached_ms=tuple(cached_ms), uncached_ms=tuple(uncached_ms), identical=cached_ids == uncached_ids)


def _sweep(lm: LoadedModel, prompt_ids: list[int], sizes: tuple[int, ...], tokens: int,
           context: RunContext = NO_CONTEXT) -> KVSweep:
    """The batch sweep; when Stop comes, only the sizes measured before it."""
    from playground.engine.kv.batch import batch_sweep

    rows = batch_sweep(lm, [prompt_ids], sizes, tokens, context)
    return KVSweep(batch_sizes=tuple(r[0] for r in rows), tokens_per_s=tuple(r[1] for r in rows),
                   ms_per_step=tuple(r[2] for r in rows), kv_bytes=tuple(r[3] for r in rows))
