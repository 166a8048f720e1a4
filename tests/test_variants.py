"""The one factory and cache of cheaper variants (``playground.engine.variants``): the same request gives the same
object, one quantized copy per model and method stays in memory (counted with weak references to every model the
builder made), a model that is freed takes its variants with it, and Stop at a build's progress point keeps
nothing."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest
import torch

from playground.config import ConfigError, QuantSettings
from playground.engine import variants
from playground.engine.quant.linear import QuantLinear
from playground.engine.run_context import RunContext
from playground.engine.variants import BuildStopped, FirstLayers, QuantizedCopy, SmallModel, variant


@pytest.fixture
def built(monkeypatch) -> weakref.WeakKeyDictionary:
    """Every model the builder makes during the test (-> its request), held weakly: what is still alive after a
    collection is what the cache (or anyone) keeps."""
    variants.clear()
    made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    real = variants.build

    def recording(*args, **kwargs):
        result = real(*args, **kwargs)
        made[result.model] = result.request
        return result

    monkeypatch.setattr(variants, "build", recording)
    yield made
    variants.clear()


def live(made: weakref.WeakKeyDictionary) -> list:
    """The quantized copies still alive."""
    gc.collect()
    return [m for m, request in list(made.items()) if isinstance(request, QuantizedCopy)]


def test_the_same_request_gives_the_same_object(tiny_lm, built):
    for request in (FirstLayers(1), QuantizedCopy.quick("rtn-int4"), QuantizedCopy.quick("rtn-int8")):
        first = variant(tiny_lm, request)
        assert variant(tiny_lm, request) is first and variant(tiny_lm, request).model is first.model
    # --quant's request for the same recipe is the same request: one copy serves the drafter and --quant.
    assert QuantizedCopy.of(QuantSettings(quant="rtn-int4", group_size=32)) == QuantizedCopy.quick("rtn-int4")
    assert QuantizedCopy.of(QuantSettings(quant="rtn-int8", group_size=128)) == QuantizedCopy.quick("rtn-int8")
    assert QuantizedCopy.of(QuantSettings(quant="rtn-int4", calibration_tokens=64)) == \
        QuantizedCopy.of(QuantSettings(quant="rtn-int4", calibration_tokens=512))  # RTN reads no calibration
    assert QuantizedCopy.of(QuantSettings(quant="awq", calibration_tokens=64)) != \
        QuantizedCopy.of(QuantSettings(quant="awq", calibration_tokens=512))
    # The option a range error names is not part of the request.
    assert variant(tiny_lm, FirstLayers(1, setting="cheap_layers")) is variant(tiny_lm, FirstLayers(1))
    assert len(built) == 3


def test_one_quantized_copy_per_model_and_method(tiny_lm, built):
    g32 = variant(tiny_lm, QuantizedCopy("rtn-int4", 32)).model
    first = weakref.ref(g32)
    del g32
    assert len(live(built)) == 1
    # Another group size of the same method replaces the copy: never two rtn-int4 copies of one model at once.
    g64 = variant(tiny_lm, QuantizedCopy("rtn-int4", 64))
    assert first() is None and live(built) == [g64.model]
    assert [v.request for v in variants.held(tiny_lm) if v.kind == "quantized"] == [QuantizedCopy("rtn-int4", 64)]
    # Another method is another copy, up to the limit in all (the least recently used goes first).
    int8 = variant(tiny_lm, QuantizedCopy.quick("rtn-int8"))
    assert len(live(built)) == 2 == variants.QUANTIZED_COPIES
    variant(tiny_lm, QuantizedCopy("rtn-int4", 64))  # used again: rtn-int8 is now the oldest
    head = variant(tiny_lm, QuantizedCopy.quick("rtn-int4-head"))
    del int8
    assert {id(m) for m in live(built)} == {id(g64.model), id(head.model)}
    # --quant with the same recipe builds nothing.
    count = len(built)
    from playground.engine.quantized.apply import quantized_lm

    qlm, _ = quantized_lm(tiny_lm, QuantSettings(quant="rtn-int4", group_size=64, calibration_tokens=32))
    assert qlm.model is g64.model and len(built) == count


def test_a_freed_model_takes_its_variants_with_it(built):
    from support.tiny_models import build_tiny_lm

    lm = build_tiny_lm(seed=5)
    copy_ = weakref.ref(variant(lm, QuantizedCopy.quick("rtn-int4")).model)
    layers = weakref.ref(variant(lm, FirstLayers(1)).model)
    assert len(variants.held(lm)) == 2
    del lm
    gc.collect()
    assert copy_() is None and layers() is None and variants.held() == []


def test_variants_equal_what_they_were(tiny_lm, built):
    """The first-layers variant runs the model's own first layers, final norm and head; a quick copy holds every
    decoder projection quantized (and the LM head with "-head"), the model left alone."""
    ids = torch.tensor([[1, 5, 9, 12, 40]])
    with torch.no_grad():
        hidden = tiny_lm.model(ids, output_hidden_states=True).hidden_states[1]
        expected = tiny_lm.model.lm_head(tiny_lm.model.model.norm(hidden))
        got = variant(tiny_lm, FirstLayers(1)).model(ids).logits
    assert torch.allclose(got, expected, atol=1e-5)
    for method, extra in (("rtn-int4", 0), ("rtn-int4-head", 1), ("rtn-int8", 0)):
        copy_ = variant(tiny_lm, QuantizedCopy.quick(method)).model
        assert sum(isinstance(m, QuantLinear) for m in copy_.modules()) == 7 * 2 + extra
    assert not any(isinstance(m, QuantLinear) for m in tiny_lm.model.modules())


def test_details_and_refusals(tiny_lm, built):
    layers = variant(tiny_lm, FirstLayers(1))
    assert variants.detail(layers, "the target") == \
        "the first 1 of 2 layers of the target + its final norm and LM head"
    head = variant(tiny_lm, QuantizedCopy.quick("rtn-int4-head"))
    assert variants.detail(head, "tiny") == "tiny with int4 weights and LM head (group 32, torch's int4 kernel)"
    with pytest.raises(ConfigError, match=r"^cheap_layers must be between 1 and 1 for this 2-layer model \(got 2\)$"):
        variant(tiny_lm, FirstLayers(2, setting="cheap_layers"))
    with pytest.raises(ConfigError, match="quantized copy must be one of rtn-int4, rtn-int4-head, rtn-int8"):
        QuantizedCopy.quick("awq")
    # One choice list for the drafter, the amateur and the cheap model, and a detail for each of its entries.
    from playground.config import CascadeSettings, ContrastiveSettings, SpeculativeSettings
    from playground.config.quant import QUICK_COPIES
    from playground.config.table import rows

    choices = {row.name: row.spec.choices for cls in (SpeculativeSettings, ContrastiveSettings, CascadeSettings)
               for row in rows(cls) if row.name in ("draft_quant", "amateur_quant", "cheap_quant")}
    assert choices == dict.fromkeys(("draft_quant", "amateur_quant", "cheap_quant"), QUICK_COPIES)
    assert set(variants.QUICK_WORDS) == set(QUICK_COPIES)
    assert variants.label(QuantizedCopy.of(QuantSettings(quant="smoothquant", smooth_alpha=0.6))) == \
        "smoothquant α=0.6"


def test_labels_details_and_the_build_reporter_say_what_was_made(tiny_lm, model_folder, built):
    """Labels name the method with its group where the method is groupwise; a small model's detail names the model
    as loaded with its parameter count; a first-layers copy's config says its layers and the model's own is
    untouched; the build reporter prefixes its reports and clamps their fractions to 0..1."""
    assert variants.label(QuantizedCopy("rtn-int4", 64)) == "rtn-int4 g64"
    assert variants.label(QuantizedCopy("awq", 128, calibration_tokens=64)) == "awq g128"
    assert variants.label(QuantizedCopy("rtn-int8")) == "rtn-int8" and variants.label(SmallModel("/x/y")) == "/x/y"
    assert variants.label(FirstLayers(3)) == "first 3 layers"
    small = variant(tiny_lm, SmallModel(str(model_folder)))
    count = sum(p.numel() for p in small.model.parameters())
    assert variants.detail(small, "the target") == f"{small.loaded.name} ({count / 1e6:.0f}M parameters)"
    assert small.loaded.name != str(model_folder)  # the name as loaded, not the path asked for
    first = variant(tiny_lm, FirstLayers(1))
    assert first.model.config.num_hidden_layers == 1 and tiny_lm.model.config.num_hidden_layers == 2
    types = getattr(tiny_lm.model.config, "layer_types", None)
    if isinstance(types, list):
        assert first.model.config.layer_types == types[:1] and len(tiny_lm.model.config.layer_types) == 2
    assert first.model.model.config is first.model.config.get_text_config(decoder=True)
    reports: list[tuple[str, float]] = []
    say = variants.build_reporter("rtn-int4 g32", "tiny", RunContext(progress=lambda m, f: reports.append((m, f))))
    say("a", -0.5)
    say("b", 0.25)
    say("c", 1.5)
    assert reports == [("rtn-int4 g32: a", 0.0), ("rtn-int4 g32: b", 0.25), ("rtn-int4 g32: c", 1.0)]


def test_a_small_model_is_loaded_once_and_shares_the_tokenizer(tiny_lm, model_folder, built):
    small = variant(tiny_lm, SmallModel(str(model_folder)))
    assert variant(tiny_lm, SmallModel(str(model_folder))) is small and small.loaded is not None
    assert variants.detail(small, "the target").endswith("M parameters)")


@pytest.mark.parametrize("method", ["rtn-int4", "rtn-int4-head", "rtn-int8"])
def test_stop_during_a_build_keeps_nothing(tiny_lm, built, method):
    """Stop at the first progress point: the build ends there (no further report), nothing is cached and the
    half-made copy is freed."""
    def quant_linears() -> int:
        gc.collect()
        return sum(type(o) is QuantLinear for o in gc.get_objects())

    before = quant_linears()
    reports: list[tuple[str, float]] = []
    with pytest.raises(BuildStopped, match="nothing was kept") as stopped:
        variant(tiny_lm, QuantizedCopy.quick(method),
                RunContext(progress=lambda message, f: reports.append((message, f)), should_stop=lambda: bool(reports)))
    assert stopped.value.cut == "quantized_copy"
    assert len(reports) == 1 and reports[0][0].startswith(variants.label(QuantizedCopy.quick(method)) + ": ")
    assert variants.held() == [] and live(built) == []
    assert quant_linears() == before  # the half-made copy is gone too
    # Stop later in the build: it ends at the next progress point.
    reports.clear()
    with pytest.raises(BuildStopped):
        variant(tiny_lm, QuantizedCopy.quick(method),
                RunContext(progress=lambda message, f: reports.append((message, f)),
                           should_stop=lambda: len(reports) >= 2))
    assert len(reports) == 2 and variants.held() == []
    # Without Stop the same request builds, reporting every layer.
    reports.clear()
    variant(tiny_lm, QuantizedCopy.quick(method), RunContext(progress=lambda message, f: reports.append((message, f))))
    assert any("quantizing layer 2/2" in m for m, _ in reports) and reports[-1][1] == 1.0


# --- Stop during a strategy's build, in the engine -----------------------------------------------------------------

BUILD_CASES = {  # a run whose variant is built before its first event
    "drafter": "speculative --draft quantized --draft-quant rtn-int4",
    "amateur": "contrastive --amateur quantized --amateur-quant rtn-int8",
    "cheap model": "cascade --cheap quantized --cheap-quant rtn-int4-head",
    "--quant": "greedy --quant rtn-int8",
    "--quant on a drafter's run": "speculative --draft layers --draft-layers 1 --quant rtn-int4 --group-size 32",
    "quantization lab": "greedy --quant rtn-int8 --compare",
}


def case(spec: str, prompt: str = "one two three", max_new_tokens: int = 4):
    from playground.config import RunSettings
    from playground.config.words import settings_from_pane

    return settings_from_pane(RunSettings(prompt=prompt, chat=False, max_new_tokens=max_new_tokens), spec)


@pytest.mark.parametrize("name", list(BUILD_CASES))
def test_stop_during_a_strategys_build_ends_the_run_stopped(tiny_lm, built, name):
    """Stop at the build's first progress report: the run is its start and a final event, "stopped", naming the
    quantized copy as what was cut; the build reports nothing more and nothing is cached. Without Stop the same
    settings build the copy (reporting progress) and decode."""
    from playground.engine.strategies import run_strategy
    from playground.events import RunFinished, RunStarted

    reports: list[str] = []
    events = list(run_strategy(tiny_lm, case(BUILD_CASES[name]), lambda: bool(reports),
                               lambda message, fraction: reports.append(message)))
    assert [type(e) for e in events] == [RunStarted, RunFinished]
    assert events[1].stop_reason == "stopped" and events[1].cut_short == ("quantized_copy",)
    assert events[1].token_ids == () and events[0].strategy == case(BUILD_CASES[name]).strategy
    assert len(reports) == 1, reports
    assert variants.held(kind=QuantizedCopy) == [] and live(built) == []

    reports.clear()
    events = list(run_strategy(tiny_lm, case(BUILD_CASES[name]), None,
                               lambda message, fraction: reports.append(message)))
    assert isinstance(events[-1], RunFinished) and events[-1].stop_reason != "stopped"
    assert events[-1].cut_short == () and len(events[-1].token_ids) == 4
    assert any("quantizing layer 2/2" in m for m in reports) and len(live(built)) == 1


SMALL_MODEL_CASES = {  # a run that loads a separate small model (the folder in {}) before its first event
    "drafter": "speculative --draft model --draft-model {}",
    "amateur": "contrastive --amateur model --amateur-model {}",
    "cheap model": "cascade --cheap model --cheap-model {}",
}


@pytest.mark.parametrize(("name", "stop_at"), [("drafter", 1), ("drafter", 2), ("drafter", 3), ("amateur", 2),
                                              ("cheap model", 3)],
                         ids=["drafter-before-the-tokenizer", "drafter-before-the-weights", "drafter-before-the-move",
                              "amateur-before-the-weights", "cheap-model-before-the-move"])
def test_stop_during_a_small_models_load_ends_the_run_stopped(tiny_lm, model_folder, built, monkeypatch, name,
                                                              stop_at):
    """Stop during the load of a separate small model is seen at the load's next phase, not at the run's first
    step: the run is its start and a final event, "stopped", naming the small model as what was cut; the load
    reads no weights once Stop came before them, and nothing is cached. Without Stop the same run loads it."""
    import transformers

    from playground.engine.strategies import run_strategy
    from playground.events import RunFinished, RunStarted

    weight_reads: list[str] = []
    real = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        weight_reads.append(str(args[0]))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(counting))
    settings = case(SMALL_MODEL_CASES[name].format(model_folder))
    reports: list[str] = []
    events = list(run_strategy(tiny_lm, settings, lambda: len(reports) >= stop_at,
                               lambda message, fraction: reports.append(message)))
    assert [type(e) for e in events] == [RunStarted, RunFinished]
    assert events[1].stop_reason == "stopped" and events[1].cut_short == ("small_model",)
    assert events[1].token_ids == ()
    assert len(reports) == stop_at, reports  # nothing more was reported: the load ended at that phase
    assert len(weight_reads) == (0 if stop_at <= 2 else 1)
    assert variants.held(kind=SmallModel) == [] and list(built) == []

    reports.clear()
    events = list(run_strategy(tiny_lm, settings, None, lambda message, fraction: reports.append(message)))
    assert isinstance(events[-1], RunFinished) and events[-1].stop_reason in ("max_new_tokens", "eos")
    # Its 4 tokens, or fewer where the random tiny model's contrast picked EOS (it does on some CPUs' float sums).
    assert events[-1].cut_short == () and (len(events[-1].token_ids) == 4 or events[-1].stop_reason == "eos")
    assert len(variants.held(kind=SmallModel)) == 1 and len(reports) > stop_at


def test_the_drafter_amateur_cheap_model_and_quant_share_one_copy(tiny_lm, built):
    """rtn-int4 in groups of 32 for all four: one build, one copy alive."""
    from playground.engine.strategies import run_strategy

    for spec in ("speculative --draft quantized --draft-quant rtn-int4",
                 "contrastive --amateur quantized --amateur-quant rtn-int4",
                 "cascade --cheap quantized --cheap-quant rtn-int4",
                 "greedy --quant rtn-int4 --group-size 32"):
        list(run_strategy(tiny_lm, case(spec)))
    assert len(built) == 1 and len(live(built)) == 1


@pytest.fixture(scope="module")
def long_lm():
    from support.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=0, max_positions=4096)


LONG_PROMPT = " ".join(["one two three four"] * 40)  # ~600 tokens of the tiny tokenizer: three chunks of 256


def test_the_amateurs_prompt_pass_reports_progress_and_stops_between_chunks(long_lm, built):
    from playground.engine.strategies import run_strategy
    from playground.events import PrefillDone, PrefillProgress, RunFinished, TokenStep

    settings = case("contrastive --amateur quantized --amateur-quant rtn-int8", prompt=LONG_PROMPT)
    events = list(run_strategy(long_lm, settings))
    done = next(i for i, e in enumerate(events) if isinstance(e, PrefillDone))
    read = events[done].prompt_tokens - 1  # the amateur reads the prompt but its last token, as the expert does
    assert 512 < read <= 768, "precondition: three chunks"
    amateur = [e for e in events[done + 1 :] if isinstance(e, PrefillProgress)]
    assert [(e.done_tokens, e.total_tokens) for e in amateur] == [(256, read), (512, read)]
    assert "amateur_prefill_ms" in events[-1].figures

    stopped: list[bool] = []
    seen = []
    for event in run_strategy(long_lm, settings, lambda: bool(stopped)):
        seen.append(event)
        if isinstance(event, PrefillProgress) and any(isinstance(e, PrefillDone) for e in seen):
            stopped.append(True)  # Stop after the amateur's first chunk
    after = seen[next(i for i, e in enumerate(seen) if isinstance(e, PrefillDone)) + 1 :]
    assert sum(isinstance(e, PrefillProgress) for e in after) == 1  # the next chunk boundary ends it
    final = seen[-1]
    assert isinstance(final, RunFinished) and final.stop_reason == "stopped"
    assert final.cut_short == ("amateur_prefill",) and "amateur_prefill_ms" not in final.figures
    assert not any(isinstance(e, TokenStep) for e in seen)


def test_a_copy_the_model_cannot_have_frees_nothing(tiny_lm, built):
    """A quantized copy of an already quantized model is refused before the cache makes room for it: the copies
    held (as many as the limit) stay."""
    held = [variant(tiny_lm, QuantizedCopy.quick(m)) for m in ("rtn-int4", "rtn-int8")]
    assert len(held) == variants.QUANTIZED_COPIES
    already = dataclasses.replace(tiny_lm, model=held[0].model)
    with pytest.raises(ConfigError, match="already quantized"):
        variant(already, QuantizedCopy.quick("rtn-int4-head"))
    assert [variants.cached(tiny_lm, v.request) for v in held] == held
