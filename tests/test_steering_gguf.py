"""llama.cpp control-vector GGUF files: what we write is what llama.cpp reads (checked here with the ``gguf``
package's own reader and writer, as llama.cpp's ``common_control_vector_load_one`` checks a file), what it would
refuse we refuse by name, and a steered run from a .gguf equals the same vector from .safetensors."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from playground.config import ConfigError, RunSettings
from playground.engine.steering.files import load_vector, save_vector
from playground.engine.steering.gguf_files import load_gguf, save_gguf
from playground.engine.steering.vector import SteeringVector
from playground.engine.strategies import run_strategy
from playground.events import TokenStep

WIDTH = 32
PROMPT = "The weather in Shanghai is"


def vector(layers=(1, 2, 3), width: int = WIDTH, seed: int = 0, **hints) -> SteeringVector:
    rng = np.random.default_rng(seed)
    dirs = {n: rng.standard_normal(width).astype(np.float32) for n in layers}
    return SteeringVector(dirs, hidden_size=width, **hints)


def write_raw(path, tensors: dict[str, np.ndarray], arch: str = "controlvector"):
    """A GGUF written with gguf-py directly (what another tool might hand us)."""
    writer = gguf.GGUFWriter(str(path), arch)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_file_we_write_is_the_format_llama_cpp_and_repeng_read(tmp_path):
    made = vector(layer_count=4, model_name="tiny-llama-0", method="pca", name="happy", info={"positive": "joy"})
    path = save_gguf(made, tmp_path / "happy.gguf")
    reader = gguf.GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    # repeng's keys (llama.cpp reads none of them), and ours beside them
    assert fields["general.architecture"] == "controlvector"
    assert fields["controlvector.model_hint"] == "tiny-llama-0"
    assert fields["controlvector.layer_count"] == 3  # repeng: how many directions the file holds
    assert fields["playground.layer_count"] == 4 and fields["playground.hidden_size"] == WIDTH
    assert fields["playground.info.positive"] == "joy"
    assert sorted(t.name for t in reader.tensors) == ["direction.1", "direction.2", "direction.3"]
    for tensor in reader.tensors:  # llama.cpp: F32, 1-D (ggml_n_dims == 1), all one width
        assert tensor.tensor_type == gguf.GGMLQuantizationType.F32 and [int(x) for x in tensor.shape] == [WIDTH]
        n = int(tensor.name.split(".")[1])
        assert np.array_equal(np.asarray(tensor.data), made.directions[n])
    back = load_gguf(path)
    assert back.layers == (1, 2, 3) and back.hidden_size == WIDTH and back.layer_count == 4
    assert (back.model_name, back.method, back.name, back.info) == ("tiny-llama-0", "pca", "happy",
                                                                    {"positive": "joy"})
    for n in made.layers:
        assert np.array_equal(back.directions[n], made.directions[n])
    assert not list(tmp_path.glob("*.partial"))


def test_a_bare_file_of_direction_tensors_reads_with_the_tensors_width(tmp_path):
    """Another tool's file: no metadata at all, a [576, 1] tensor (1-D for ggml), blocks out of order."""
    rng = np.random.default_rng(1)
    dirs = {5: rng.standard_normal(WIDTH).astype(np.float32), 2: rng.standard_normal(WIDTH).astype(np.float32)}
    path = write_raw(tmp_path / "bare.gguf", {"direction.5": dirs[5], "direction.2": dirs[2].reshape(1, WIDTH)})
    back = load_vector(path)
    assert back.layers == (2, 5) and back.hidden_size == WIDTH and back.layer_count == 0
    assert back.name == "bare" and back.model_name == ""
    assert np.array_equal(back.directions[2], dirs[2]) and np.array_equal(back.directions[5], dirs[5])


def test_what_llama_cpp_would_not_read_is_refused_on_saving(tmp_path):
    with pytest.raises(ConfigError, match=r"block 0, which llama\.cpp refuses"):
        save_gguf(vector(layers=(0, 1)), tmp_path / "zero.gguf")
    front = SteeringVector({1: np.ones((3, WIDTH), np.float32)}, hidden_size=WIDTH, name="actadd", method="actadd")
    with pytest.raises(ConfigError, match=r"'actadd' adds per-position rows.*Save it as \.safetensors"):
        save_vector(front, tmp_path / "front.gguf")
    assert not list(tmp_path.iterdir())


def test_damaged_and_foreign_files_are_named(tmp_path):
    good = save_gguf(vector(), tmp_path / "good.gguf").read_bytes()
    cases = {
        "cut.gguf": (good[: len(good) - 40], "is damaged or not a GGUF file"),
        "junk.gguf": (b"GGUF\x03\x00\x00\x00" + b"\xff" * 30, "is damaged or not a GGUF file"),
        "text.gguf": (b"not a gguf at all", "is damaged or not a GGUF file"),
    }
    for name, (data, why) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ConfigError, match=rf"{name} {why}"):
            load_vector(tmp_path / name)
    one = np.ones(WIDTH, np.float32)
    raw = {
        "zero.gguf": ({"direction.0": one}, "tensor direction.0 is for block 0"),
        "other.gguf": ({"direction.1": one, "token_embd.weight": one}, "tensor 'token_embd.weight' is not named"),
        "half.gguf": ({"direction.1": one.astype(np.float16)}, "tensor direction.1 is F16, not F32"),
        "flat.gguf": ({"direction.1": np.ones((2, WIDTH), np.float32)},
                      r"tensor direction.1 has shape \[32, 2\], not 1-D"),
        "mixed.gguf": ({"direction.1": one, "direction.2": np.ones(16, np.float32)},
                       r"its directions differ in width \(direction.1: 32, direction.2: 16\)"),
        "empty.gguf": ({}, "holds no direction.N tensors"),
    }
    for name, (tensors, why) in raw.items():
        write_raw(tmp_path / name, tensors)
        with pytest.raises(ConfigError, match=rf"{name}(:)? {why}"):
            load_vector(tmp_path / name)
    write_raw(tmp_path / "model.gguf", {"token_embd.weight": one}, arch="llama")
    with pytest.raises(ConfigError, match=r"model\.gguf is a GGUF of architecture 'llama'"):
        load_vector(tmp_path / "model.gguf")
    with pytest.raises(ConfigError, match=r"gone\.gguf does not exist"):
        load_vector(tmp_path / "gone.gguf")


def steered_tokens(lm, *specs: str, **flat) -> list[int]:
    settings = RunSettings.from_flat(prompt=PROMPT, chat=False, max_new_tokens=6, steer=specs, **flat)
    return [e.token_id for e in run_strategy(lm, settings) if isinstance(e, TokenStep)]


def test_a_gguf_steers_as_the_same_vector_in_safetensors_and_a_wrong_width_is_refused_by_name(tiny_lm, tmp_path):
    lm = tiny_lm  # two blocks: 0 and 1
    made = vector(layers=(1,), seed=4).scaled(3.0)
    gguf_path = save_vector(made, tmp_path / "v.gguf")
    st_path = save_vector(made, tmp_path / "v.safetensors")
    plain = steered_tokens(lm)
    from_gguf = steered_tokens(lm, f"{gguf_path}:2", steer_layers="1-1")
    assert from_gguf == steered_tokens(lm, f"{st_path}:2", steer_layers="1-1")
    assert from_gguf != plain, "precondition: the vector changes the output"
    wide = save_gguf(vector(width=48, model_name="llama"), tmp_path / "wide.gguf")
    with pytest.raises(ConfigError, match=r"wide\.gguf \(made on llama\) is 48 wide.*hidden size is 32"):
        steered_tokens(lm, str(wide))
