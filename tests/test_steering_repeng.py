"""A control vector repeng 0.4.0 trained and exported (tests/data/repeng_tiny_llama.gguf, made by
tests/support/make_repeng_fixture.py in a numpy<2 venv: repeng does not import under NumPy 2) loads with our reader,
holds what the ``gguf`` package reads from the file itself, and steers exactly as the same vector saved as
safetensors, and as repeng's own ``ControlModel`` steered that model (its logits recorded beside the file)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from support.make_repeng_fixture import COEFF, LAYERS
from support.tiny_models import build_tiny_lm

from playground.engine.steering.files import load_vector, save_vector
from playground.engine.steering.hooks import SteeringHooks

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "repeng_tiny_llama.gguf"


@pytest.fixture(scope="module")
def recorded():
    path = str(DATA / "repeng_tiny_llama_logits.safetensors")
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    return load_file(path), meta


def test_repengs_file_is_what_the_gguf_package_reads_and_it_steers_as_repeng_did(recorded, tmp_path):
    reader = gguf.GGUFReader(str(FIXTURE))
    assert reader.fields["general.architecture"].contents() == "controlvector"
    assert reader.fields["controlvector.model_hint"].contents() == "llama"
    assert reader.fields["controlvector.layer_count"].contents() == len(LAYERS)
    stored = {int(t.name.split(".")[1]): np.array(t.data) for t in reader.tensors}
    assert sorted(stored) == list(LAYERS)
    ours = load_vector(FIXTURE)
    assert ours.layers == LAYERS and ours.hidden_size == 32 and ours.model_name == "llama"
    for n in LAYERS:
        assert np.array_equal(ours.directions[n], stored[n])
        assert np.linalg.norm(stored[n]) == pytest.approx(1.0, abs=1e-5)  # repeng's PCA directions: unit norm
    same = load_vector(save_vector(ours, tmp_path / "same.safetensors"))

    tensors, meta = recorded
    assert float(meta["coeff"]) == COEFF
    lm = build_tiny_lm(seed=0, layers=4)
    ids = tensors["input_ids"][None]

    def logits(vector=None) -> torch.Tensor:
        if vector is None:
            with torch.inference_mode():
                return lm.model(input_ids=ids).logits[0]
        hooks = SteeringHooks(lm.model, [vector], (COEFF,), LAYERS)
        with hooks.installed(), hooks.active(), torch.inference_mode():
            return lm.model(input_ids=ids).logits[0]

    # The same weights give the same logits up to float32 round-off, which differs between CPUs (the fixture was
    # recorded on another machine); a different model is off by whole units.
    assert torch.allclose(logits(), tensors["unsteered"], rtol=1e-5, atol=1e-5), (
        "the tiny model is not the one the fixture was made on: rerun tests/support/make_repeng_fixture.py")
    from_gguf, from_safetensors = logits(ours), logits(same)
    assert torch.equal(from_gguf, from_safetensors)
    assert float((tensors["steered"] - tensors["unsteered"]).abs().max()) > 1.0, "precondition: repeng steered"
    torch.testing.assert_close(from_gguf, tensors["steered"], rtol=1e-5, atol=1e-5)
