"""A steering vector's own checks and maths, on small arrays built in the test (no model): what it stores, what it
refuses and how the refusal reads, its unit direction, and repeng's principal component at its edges (two pairs,
one pair, a tied sign vote). The mutation run over engine/steering/vector.py left these unguarded."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from transformers import Gemma3Config

from playground.config.errors import ConfigError
from playground.engine.steering.vector import SteeringVector, first_component, mean_difference, model_width


def test_directions_are_stored_as_float32_whatever_they_came_as():
    vector = SteeringVector({2: np.arange(4, dtype=np.float64)}, hidden_size=4)
    assert vector.directions[2].dtype == np.float32
    assert vector.directions[2].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(("directions", "message"), [
    ({1: np.ones(4), 2: np.ones((2, 4))}, r"'v': every block's direction must be \[hidden\] or \[positions, hidden\] "
                                          r"alike \(got shapes \[\(2, 4\), \(4,\)\]\)"),
    ({1: np.ones((2, 2, 4))}, r"'v': every block's direction must be .* \(got shapes \[\(2, 2, 4\)\]\)"),
    ({1: np.ones(4), 2: np.ones(5)}, r"'v': its directions are \[4, 5\] wide but it says hidden size 4"),
    ({-1: np.ones(4), 3: np.ones(4)}, r"'v': block numbers start at 0 \(got -1\)"),
])
def test_a_malformed_vector_is_refused_saying_what_is_wrong(directions, message):
    with pytest.raises(ConfigError, match=message):
        SteeringVector(directions, hidden_size=4, name="v")


def test_the_unit_direction_is_the_direction_over_its_norm_and_zero_for_a_zero_direction():
    vector = SteeringVector({0: np.array([3.0, 0.0, 4.0]), 1: np.zeros(3)}, hidden_size=3)
    assert vector.unit(0).tolist() == pytest.approx([0.6, 0.0, 0.8])
    assert vector.unit(1).tolist() == [0.0, 0.0, 0.0]
    actadd = SteeringVector({2: np.array([[1.0, 0, 0], [0, 2.0, 0]])}, hidden_size=3)
    assert actadd.unit(2).tolist() == pytest.approx([1 / 5 ** 0.5, 2 / 5 ** 0.5, 0.0])  # its rows' sum


def test_a_vector_for_another_model_is_refused_with_the_numbers():
    vector = SteeringVector({4: np.ones(8)}, hidden_size=8, layer_count=0, model_name="llama")
    with pytest.raises(ConfigError, match=r"^steering vector v.gguf \(made on llama\) is 8 wide, but tiny's hidden "
                                          r"size is 16: it was made for another model$"):
        vector.check_fits(16, 30, "tiny", "v.gguf")
    unnamed = SteeringVector({4: np.ones(8)}, hidden_size=8)
    with pytest.raises(ConfigError, match=r"^steering vector v.gguf is 8 wide"):
        unnamed.check_fits(16, 30, "tiny", "v.gguf")
    with pytest.raises(ConfigError, match=r"^steering vector \(unnamed\) is 8 wide"):  # no file: the vector's name
        unnamed.check_fits(16, 30, "tiny")
    # block 4 needs five blocks: four are one too few, five are enough
    with pytest.raises(ConfigError, match=r"^steering vector v.gguf has a direction for block 4 \(numbered from 0\), "
                                          r"but tiny has 4 decoder blocks \(0 to 3\): it was made for a deeper model$"):
        vector.check_fits(8, 4, "tiny", "v.gguf")
    vector.check_fits(8, 5, "tiny", "v.gguf")
    made_for_six = SteeringVector({1: np.ones(8)}, hidden_size=8, layer_count=6)
    with pytest.raises(ConfigError, match=r"^steering vector v.st was made for a model with 6 decoder blocks "
                                          r"\(another model\), but tiny has 5$"):
        made_for_six.check_fits(8, 5, "tiny", "v.st")


def test_the_width_of_a_multimodal_model_is_its_text_decoders():
    config = Gemma3Config(text_config={"hidden_size": 48, "num_hidden_layers": 2})
    assert model_width(SimpleNamespace(config=config)) == 48


def test_the_mean_difference_is_float32_of_the_float64_means():
    positive = np.array([[1.0, 2.0], [3.0, 6.0]], dtype=np.float32)
    negative = np.array([[0.5, 0.5]], dtype=np.float32)
    got = mean_difference(positive, negative)
    assert got.dtype == np.float32 and got.tolist() == [1.5, 3.5]


def test_the_principal_component_at_its_edges():
    rng = np.random.default_rng(0)
    positive, negative = rng.normal(size=(2, 6)), rng.normal(size=(2, 6))
    # two pairs: the centred differences are ±(d1 − d2)/2, so the component is ±(d1 − d2)/‖d1 − d2‖
    d = (positive[0] - negative[0]) - (positive[1] - negative[1])
    got = first_component(positive, negative)
    assert got.dtype == np.float32
    assert abs(float(got @ d)) / np.linalg.norm(d) == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ConfigError, match=r"needs at least two contrast pairs \(one pair's difference has no "
                                          r"spread\): use the mean difference for a single pair"):
        first_component(positive[:1], negative[:1])
    with pytest.raises(ConfigError, match=r"in pairs \(got 3 positive, 2 negative\)"):
        first_component(rng.normal(size=(3, 6)), negative)


def test_a_tied_sign_vote_keeps_the_decompositions_sign():
    # differences (1, 0) and (−1, 0): one pair projects higher on the positive side, the other lower; repeng flips
    # the sign only when more pairs vote for it, so a tie keeps what the SVD of the centred differences gave
    positive = np.array([[1.0, 0.0], [-1.0, 0.0]])
    negative = np.zeros((2, 2))
    diffs = positive - negative
    _, _, vt = np.linalg.svd(diffs - diffs.mean(axis=0, keepdims=True), full_matrices=False)
    assert first_component(positive, negative).tolist() == pytest.approx((vt[0] / np.linalg.norm(vt[0])).tolist())
