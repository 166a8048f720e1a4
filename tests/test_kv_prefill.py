"""The KV lab reads its prompt as every strategy does: in chunks, with progress and Stop between them, into each
holder (contiguous, paged, quantized); a chunked read leaves each holder with what one pass would (the logits at the
prompt's end and at the steps after it equal one pass's, on every family's tiny model, across sliding windows)."""

from __future__ import annotations

import pytest
import torch
from support.tiny_models import FAMILIES, TINY_WINDOW, build_tiny_lm

from playground.config import KVSettings, RunSettings
from playground.config.words import settings_from_pane
from playground.engine.forward import PREFILL_CHUNK, prefill_in_chunks
from playground.engine.kv.decode import new_cache
from playground.engine.strategies import run_strategy
from playground.events import PrefillDone, PrefillProgress, RunFinished, TokenStep
from playground.events.kv import KVPhase, KVStep

HOLDERS = {  # the KV lab's holders, as its options name them
    "contiguous": "",
    "paged": "--paged --block-size 16",
    "paged, 1-token blocks": "--paged --block-size 1",
    "paged int8": "--paged --kv-dtype int8",
    "int8": "--kv-dtype int8",
    "int4 per-token": "--kv-dtype int4-per-token",
}
LONG_PROMPT = " ".join(["one two three four"] * 40)  # ~600 tokens of the tiny tokenizer: three chunks of 256


def kv_settings(options: str) -> KVSettings:
    return settings_from_pane(RunSettings(), f"kv-cache {options}").group(KVSettings)


def lab(options: str, prompt: str = LONG_PROMPT, new_tokens: int = 6) -> RunSettings:
    return settings_from_pane(RunSettings(prompt=prompt, chat=False, max_new_tokens=new_tokens),
                              f"kv-cache {options} --no-compare-no-cache")


@pytest.fixture(scope="module")
def long_lm():
    return build_tiny_lm(seed=0, max_positions=4096)


@pytest.fixture(scope="module", params=FAMILIES)
def family_lm(request):
    return build_tiny_lm(seed=3, family=request.param, max_positions=512)


def read(model, cache, ids: torch.Tensor, chunk: int, steps: list[int]) -> list[torch.Tensor]:
    """Last logits after reading ``ids`` [1, n] into ``cache`` ``chunk`` tokens at a time (the whole at once when
    ``chunk`` >= n), then after each of ``steps`` fed one at a time: what the next tokens see of the cache."""
    chunks = prefill_in_chunks(model, ids, chunk=chunk, cache=cache)
    while True:
        try:
            next(chunks)
        except StopIteration as end:
            logits, cache = end.value
            break
    out = [logits[0].float()]
    for token in steps:
        out.append(model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True).logits[0, -1].float())
    return out


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_a_chunked_read_leaves_each_holder_as_one_pass_does(family_lm, holder):
    """40 prompt tokens in chunks of 5 and of 7 (below the sliding window of 12 and across it), then four tokens one
    at a time: every logit equals the one-pass read's into the same kind of holder."""
    lm, kv = family_lm, kv_settings(HOLDERS[holder])
    ids = torch.tensor([[(7 * i) % 300 + 3 for i in range(40)]])
    steps = [11, 42, 99, 250]
    assert ids.shape[1] > 3 * TINY_WINDOW
    with torch.inference_mode():
        whole = read(lm.model, new_cache(lm, kv), ids, ids.shape[1], steps)
        for chunk in (5, 7):
            chunked = read(lm.model, new_cache(lm, kv), ids, chunk, steps)
            for a, b in zip(chunked, whole, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_the_kv_lab_reads_a_long_prompt_in_chunks_with_progress(long_lm, holder):
    events = list(run_strategy(long_lm, lab(HOLDERS[holder])))
    done = next(e for e in events if isinstance(e, PrefillDone))
    n = done.prompt_tokens
    assert 2 * PREFILL_CHUNK < n <= 3 * PREFILL_CHUNK, "precondition: three chunks"
    progress = [(e.done_tokens, e.total_tokens) for e in events if isinstance(e, PrefillProgress)]
    assert progress == [(256, n), (512, n)] and done.forward_passes == 3
    # The prefill's phase just before PrefillDone; its bytes are what the first step holds (that step's token came
    # from the prefill's logits: it read nothing new).
    phase = next(e for e in events if isinstance(e, KVPhase) and e.phase == "prefill")
    assert events.index(phase) == events.index(done) - 1 and phase.tokens == n
    first = next(e for e in events if isinstance(e, KVStep))
    assert done.kv_cache_bytes > 0 and first.step == 0 and first.total_bytes == done.kv_cache_bytes
    # The tokens are those of the same holder read in one pass, then decoded greedily.
    kv = kv_settings(HOLDERS[holder])
    prompt = torch.tensor([list(next(iter(events)).prompt_token_ids)])
    with torch.inference_mode():
        cache = new_cache(long_lm, kv)
        logits = long_lm.model(input_ids=prompt, cache=cache, use_cache=True).logits[0, -1]
        expected = []
        for _ in range(6):
            expected.append(int(logits.argmax()))
            logits = long_lm.model(input_ids=torch.tensor([[expected[-1]]]), cache=cache,
                                   use_cache=True).logits[0, -1]
    assert [e.token_id for e in events if isinstance(e, TokenStep)] == expected
    assert events[-1].stop_reason == "max_new_tokens"


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_stop_between_the_kv_labs_prompt_chunks(long_lm, holder):
    """Stop after the first chunk: the prompt read ends at the next chunk boundary, no step runs, and the run
    ends "stopped" with its final event."""
    seen: list = []
    for event in run_strategy(long_lm, lab(HOLDERS[holder]), lambda: any(isinstance(e, PrefillProgress) for e in seen)):
        seen.append(event)
    assert sum(isinstance(e, PrefillProgress) for e in seen) == 1
    assert not any(isinstance(e, (PrefillDone, TokenStep, KVStep)) for e in seen)
    final = seen[-1]
    assert isinstance(final, RunFinished) and final.stop_reason == "stopped" and final.token_ids == ()
    assert final.cut_short == ()


def test_without_a_cache_the_prompt_is_one_pass(long_lm):
    settings = RunSettings.from_flat(strategy="kv-cache", prompt=LONG_PROMPT, chat=False, max_new_tokens=2,
                                     no_cache=True, compare_no_cache=False)
    events = list(run_strategy(long_lm, settings))
    assert not any(isinstance(e, PrefillProgress) for e in events)
    done = next(e for e in events if isinstance(e, PrefillDone))
    assert done.kv_cache_bytes == 0 and done.forward_passes == 1
