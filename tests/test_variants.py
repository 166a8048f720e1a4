"""The one factory and cache of cheaper variants (``playground.engine.variants``): the same request gives the same
object, one quantized copy per model and method stays in memory (counted with weak references to every model the
builder made), a model that is freed takes its variants with it, and Stop at a build's progress point keeps
nothing."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from playground.config import ConfigError, QuantSettings
from playground.engine import variants
from playground.engine.quant.linear import QuantLinear
from playground.engine.variants import BuildStopped, FirstLayers, QuantizedCopy, SmallModel, variant


@pytest.fixture
def built(monkeypatch) -> weakref.WeakSet:
    """Every model the builder makes during the test, held weakly: what is still alive after a collection is what
    the cache (or anyone) keeps."""
    variants.clear()
    made: weakref.WeakSet = weakref.WeakSet()
    real = variants.build

    def recording(*args, **kwargs):
        result = real(*args, **kwargs)
        made.add(result.model)
        return result

    monkeypatch.setattr(variants, "build", recording)
    yield made
    variants.clear()


def live(made: weakref.WeakSet) -> list:
    gc.collect()
    return [m for m in made if any(isinstance(x, QuantLinear) for x in m.modules())]


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
    from playground.engine.quant.apply import quantized_lm

    qlm, _ = quantized_lm(tiny_lm, QuantSettings(quant="rtn-int4", group_size=64, calibration_tokens=32))
    assert qlm.model is g64.model and len(built) == count


def test_a_freed_model_takes_its_variants_with_it(built):
    from playground.tiny_models import build_tiny_lm

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
    assert variants.label(QuantizedCopy.of(QuantSettings(quant="smoothquant", smooth_alpha=0.6))) == \
        "smoothquant α=0.6"


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
        variant(tiny_lm, QuantizedCopy.quick(method), lambda message, f: reports.append((message, f)),
                should_stop=lambda: bool(reports))
    assert stopped.value.cut == "quantized_copy"
    assert len(reports) == 1 and reports[0][0].startswith(variants.label(QuantizedCopy.quick(method)) + ": ")
    assert variants.held() == [] and live(built) == []
    assert quant_linears() == before  # the half-made copy is gone too
    # Stop later in the build: it ends at the next progress point.
    reports.clear()
    with pytest.raises(BuildStopped):
        variant(tiny_lm, QuantizedCopy.quick(method), lambda message, f: reports.append((message, f)),
                should_stop=lambda: len(reports) >= 2)
    assert len(reports) == 2 and variants.held() == []
    # Without Stop the same request builds, reporting every layer.
    reports.clear()
    variant(tiny_lm, QuantizedCopy.quick(method), lambda message, f: reports.append((message, f)))
    assert any("quantizing layer 2/2" in m for m, _ in reports) and reports[-1][1] == 1.0
