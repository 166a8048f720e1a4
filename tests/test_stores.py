"""The models already on this computer (issue 34, point 2) and fit before load (point 4).

The stores are built here as each tool lays them out (the Hugging Face cache's blobs and snapshot links, LM Studio's
PUBLISHER/REPO folders, Ollama's manifests naming blobs, an added folder), with the default model's own GGUF and
folder hard-linked in (no copies); the figures are checked against independent readers: gguf's GGUFReader on a
small GGUF written here, safetensors' own header reader, huggingface_hub's cache scan, transformers' GGUF table.
"""

from __future__ import annotations

import json
import os
import re
import time
from math import prod
from pathlib import Path

import numpy as np
import pytest

from playground.cli import main
from playground.config import ModelSettings
from playground.models.default_model import (
    GGUF_MEMBER,
    GGUF_SHA256,
    default_gguf_path,
    default_model_dir,
    is_default_model_ready,
)
from playground.models.fit import ModelDoesNotFit, fast_bf16_cpu, fit_problem, free_ram
from playground.models.gguf_header import FILE_TYPES, TENSOR_TYPES, ArrayInfo, read_gguf_header
from playground.models.loading import load_model, resolve_model_source
from playground.models.stores import GGUF_LOADABLE, Store, describe, describe_folder, scan

needs_default = [pytest.mark.model, pytest.mark.skipif(not is_default_model_ready(),
                                                       reason="the default model is not fetched")]


def _write_small_gguf(path: Path, *, vocabulary: int = 300) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny test")
    writer.add_block_count(2)
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"tok{i}" * (i % 5) for i in range(vocabulary)])  # empty strings too
    writer.add_token_scores([float(i) / 7 for i in range(vocabulary)])
    writer.add_token_types([1 + i % 3 for i in range(vocabulary)])
    writer.add_array("test.small_ints", [3, 1, 4, 1, 5])
    writer.add_bool("test.flag", True)
    writer.add_int8("test.int8", -7)
    writer.add_uint64("test.uint64", 2**40 + 3)
    writer.add_float64("test.float64", 0.125)
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((vocabulary, 64), dtype=np.float32))
    quantized = gguf.quants.quantize(rng.standard_normal((64, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_q.weight", quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((96, 64)).astype(np.float16))
    writer.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_the_header_reader_reads_what_gguf_reader_reads(tmp_path):
    import gguf

    path = tmp_path / "small.gguf"
    _write_small_gguf(path)
    header = read_gguf_header(path)
    reader = gguf.GGUFReader(path)
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert list(header.metadata) == keys
    for key in keys:
        field = reader.fields[key]
        ours = header.metadata[key]
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert isinstance(ours, ArrayInfo) and ours.length == len(field.data), key
            if ours.values is not None:
                assert list(ours.values) == list(field.contents()), key
        else:
            assert ours == pytest.approx(field.contents()), key
    assert [(t.name, t.shape, t.type) for t in header.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type)) for t in reader.tensors]
    assert header.parameters == sum(int(t.n_elements) for t in reader.tensors) == 300 * 64 + 64 * 64 + 96 * 64 + 64
    assert header.quantization == "Q8_0"  # general.file_type
    assert [t.type_name for t in header.tensors] == [t.tensor_type.name for t in reader.tensors]


def test_a_cut_or_foreign_file_is_refused_with_its_name(tmp_path):
    path = tmp_path / "small.gguf"
    _write_small_gguf(path)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:900])
    with pytest.raises(ValueError, match="cut short"):
        read_gguf_header(cut)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(40))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf_header(other)


def test_the_type_names_are_ggufs_and_the_loadable_architectures_transformers():
    import gguf
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    assert {k: gguf.GGMLQuantizationType(k).name for k in TENSOR_TYPES} == TENSOR_TYPES
    assert {k: gguf.LlamaFileType(k).name.removeprefix("MOSTLY_").removeprefix("ALL_") for k in FILE_TYPES} \
        == FILE_TYPES
    assert set(GGUF_CONFIG_MAPPING) - {"general", "tokenizer"} == GGUF_LOADABLE


def _link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another filesystem: a link is what the tools make too
        target.symlink_to(source)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A home with the default model in each store, laid out as each tool lays it out."""
    home = tmp_path_factory.mktemp("home")
    gguf, folder = default_gguf_path(), default_model_dir()
    # Hugging Face cache: a safetensors repo and a GGUF repo; snapshots link into blobs/ named by the file's hash.
    hub = home / ".cache" / "huggingface" / "hub"
    revision = "0123456789abcdef0123456789abcdef01234567"
    for repo, files in (("models--HuggingFaceTB--SmolLM2-135M-Instruct",
                         ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]),
                        ("models--bartowski--SmolLM2-135M-Instruct-GGUF", [gguf.name])):
        (hub / repo / "refs").mkdir(parents=True)
        (hub / repo / "refs" / "main").write_text(revision)
        for number, name in enumerate(files):
            blob = hub / repo / "blobs" / (GGUF_SHA256 if name == gguf.name else f"{number:064x}")
            _link(gguf if name == gguf.name else folder / name, blob)
            link = hub / repo / "snapshots" / revision / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    # LM Studio (now and before): PUBLISHER/REPO/FILE.gguf, with a vision projector beside that is no model.
    for root in (home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"):
        repo = root / "lmstudio-community" / "SmolLM2-135M-Instruct-GGUF"
        _link(gguf, repo / gguf.name)
    (home / ".lmstudio" / "models" / "lmstudio-community" / "SmolLM2-135M-Instruct-GGUF" / "mmproj-x.gguf"
     ).write_bytes(b"")
    # Ollama: a manifest per NAME/TAG naming the model layer's blob (and the template and parameters layers).
    ollama = home / ".ollama" / "models"
    _link(gguf, ollama / "blobs" / f"sha256-{GGUF_SHA256}")
    for namespace, name, tag in (("library", "smollm2", "135m"), ("someone", "smol", "q4_1")):
        manifest = ollama / "manifests" / "registry.ollama.ai" / namespace / name / tag
        manifest.parent.mkdir(parents=True)
        manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{GGUF_SHA256}",
             "size": gguf.stat().st_size},
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64, "size": 10}]}))
    # A folder of the user's own: a model folder two levels down, a loose GGUF and a GGUF split in two.
    mine = home / "my-models"
    for part in (1, 2):
        _link(gguf, mine / "split" / f"smol-{part:05d}-of-00002.gguf")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        _link(folder / name, mine / "chat" / "smollm2" / name)
    _link(gguf, mine / "loose" / "smol.gguf")
    return home


def _stores_of(home: Path) -> list[Store]:
    from playground.models.stores import all_stores

    env = {"XDG_CONFIG_HOME": str(home / ".config")}
    return [s for s in all_stores(env, home) if not str(s.root).startswith("/usr/")] + [Store("folder",
                                                                                               home / "my-models")]


@needs_default[0]
@needs_default[1]
def test_every_store_lists_the_default_model_with_its_figures(stores):
    from huggingface_hub import scan_cache_dir
    from safetensors import safe_open

    found = scan(_stores_of(stores))
    gguf_name = default_gguf_path().name
    assert sorted((e.store, e.name) for e in found.entries) == sorted([
        ("Hugging Face cache", "HuggingFaceTB/SmolLM2-135M-Instruct"),
        ("Hugging Face cache", f"bartowski/SmolLM2-135M-Instruct-GGUF/{gguf_name}"),
        ("LM Studio", f"lmstudio-community/SmolLM2-135M-Instruct-GGUF/{gguf_name}"),  # ~/.lmstudio/models
        ("LM Studio", f"lmstudio-community/SmolLM2-135M-Instruct-GGUF/{gguf_name}"),  # ~/.cache/lm-studio/models
        ("Ollama", "smollm2:135m"), ("Ollama", "someone/smol:q4_1"),
        ("folder", "chat/smollm2"), ("folder", "loose/smol.gguf"), ("folder", "split/smol-00001-of-00002.gguf")])
    names = {(e.store, e.name): e for e in found.entries}
    hub = stores / ".cache" / "huggingface" / "hub"
    # huggingface_hub's own scan finds the same repos at the same snapshots.
    cached = {repo.repo_id: next(iter(repo.revisions)).snapshot_path for repo in scan_cache_dir(hub).repos}
    assert {e.name.split("/")[0] + "/" + e.name.split("/")[1]: e.path if e.format == "folder" else e.path.parent
            for e in found.entries if e.store == "Hugging Face cache"} == cached
    with safe_open(default_model_dir() / "model.safetensors", "np") as weights:
        parameters = sum(prod(weights.get_slice(k).get_shape()) for k in weights.keys())  # noqa: SIM118
    float32_bytes = (default_model_dir() / "model.safetensors").stat().st_size
    with (default_model_dir() / "model.safetensors").open("rb") as file:
        header_bytes = 8 + int.from_bytes(file.read(8), "little")
    split = names["folder", "split/smol-00001-of-00002.gguf"]
    assert split.problem is not None and "split GGUF (part 1 of 2)" in split.problem
    assert split.file_bytes == 2 * default_gguf_path().stat().st_size  # both parts
    for entry in found.entries:
        if entry is split:
            continue
        assert (entry.family, entry.parameters, entry.problem, entry.views) == ("Llama", parameters, None,
                                                                              "every view"), entry
        if entry.format == "gguf":
            assert entry.quantization == Path(GGUF_MEMBER).stem.split(".")[-1] == "Q4_1"
            assert entry.file_bytes == default_gguf_path().stat().st_size
        else:
            assert (entry.quantization, entry.file_bytes) == ("F32", float32_bytes)
        # float32 weights: 4 bytes a parameter, the safetensors file less its header
        assert entry.memory_bytes("float32") == float32_bytes - header_bytes
        assert entry.memory_bytes("bfloat16") == entry.memory_bytes("float32") // 2
    ollama = names["Ollama", "smollm2:135m"]
    assert ollama.path == stores / ".ollama" / "models" / "blobs" / f"sha256-{GGUF_SHA256}"
    # A blob without .gguf opens as the GGUF it is, named as Ollama names it (by hand: a 6-token trace of the
    # default model's blob, converted in 45 s, answers " Paris.").
    assert resolve_model_source(str(ollama.path))[1:] == (ollama.path.name, "smollm2:135m")
    assert not any(e.path.name.startswith("mmproj") for e in found.entries)
    assert found.seconds < 2, found.seconds


@needs_default[0]
@needs_default[1]
def test_playground_models_lists_them_and_keeps_added_folders(stores, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(stores))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(stores / ".config"))
    for name in ("HF_HUB_CACHE", "HF_HOME", "OLLAMA_MODELS", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    assert main(["models", "--add", str(stores / "my-models"), "--device", "cpu"]) == 0
    table = capsys.readouterr().out
    assert f"added {stores / 'my-models'}" in table
    for name in ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2:135m", "chat/smollm2", "loose/smol.gguf"):
        assert name in table
    assert "memory (float32)" in table and "538 MB" in table and "every view" in table
    assert main(["models", "--json", "--dtype", "bfloat16", "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {row["store"] for row in rows} >= {"Hugging Face cache", "LM Studio", "Ollama", "folder"}
    assert all(row["memory_bytes_bfloat16"] == 2 * row["parameters_count"] for row in rows)
    assert main(["models", "--remove", str(stores / "my-models"), "--json", "--device", "cpu"]) == 0
    assert "chat/smollm2" not in capsys.readouterr().out
    assert main(["models", "--remove", str(stores / "my-models")]) == 2
    assert "is not one of the added folders" in capsys.readouterr().err


def _sparse_model(folder: Path, rows: int, width: int = 4096) -> Path:
    """A model folder whose safetensors header declares ``rows x width`` float32 weights, the data a hole."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                    "num_attention_heads": 8, "hidden_size": width}))
    nbytes = rows * width * 4
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "F32", "shape": [rows, width],
                                                       "data_offsets": [0, nbytes]}}).encode()
    path = folder / "model.safetensors"
    with path.open("wb") as file:
        file.write(len(header).to_bytes(8, "little") + header)
        file.truncate(8 + len(header) + nbytes)
    return folder


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no MemAvailable here")


def test_a_model_that_does_not_fit_is_refused_before_loading_with_the_figures(tmp_path):
    free = _mem_available()
    width = 4096
    # float32 needs 1.3x the free RAM, bfloat16 0.65x: the other programs here may take or give back some meanwhile
    rows = int(free * 1.3 / 4 / width)
    folder = _sparse_model(tmp_path / "big", rows, width)
    started = time.perf_counter()
    with pytest.raises(ModelDoesNotFit) as refusal:
        load_model(ModelSettings(path=str(folder), device="cpu", dtype="float32"))
    assert time.perf_counter() - started < 30  # nothing was read (reading 1.3x the free RAM would take minutes)
    message = str(refusal.value)
    need_gb = rows * width * 4 / 1e9
    assert f"need {need_gb:.0f} GB for the weights alone" in message and "at float32 (4 bytes each)" in message
    said = re.search(r"and ([\d.]+) GB of RAM \(MemAvailable\) is free", message)
    assert said is not None, message
    assert abs(float(said[1]) - free / 1e9) < 0.2 * free / 1e9  # what the kernel said then, give or take the others
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    assert f"At bfloat16 it needs {rows * width * 2 / 1e9:.0f} GB and would fit" in message
    assert ("fast on this CPU: avx512_bf16" in message or "fast on this CPU: amx_bf16" in message) == (
        " avx512_bf16" in flags or " amx_bf16" in flags)
    entry = describe_folder(folder)
    assert fit_problem(entry, "bfloat16", free_ram(), fast_bf16_cpu()) is None
    # Three times the RAM: bfloat16 does not fit either, and the message says what else to do.
    huge = describe_folder(_sparse_model(tmp_path / "huge", int(free * 3 / 4 / width), width))
    assert "Close other programs" in str(fit_problem(huge, "float32", free_ram(), fast_bf16_cpu()))


def test_a_gguf_that_does_not_fit_is_refused_before_its_conversion(tmp_path):
    import gguf

    free = _mem_available()
    rows, width = int(free * 2 / 4 / 2048), 2048
    path = tmp_path / "big.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    nbytes = rows * width // 32 * 34  # Q8_0: 34 bytes per block of 32
    writer.add_tensor_info("token_embd.weight", (rows, width // 32 * 34), np.dtype(np.uint8), nbytes,
                           raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    with path.open("r+b") as file:
        file.truncate(path.stat().st_size + nbytes)
    assert describe(path).parameters == rows * width
    with pytest.raises(ModelDoesNotFit, match=f"need {rows * width * 4 / 1e9:.0f} GB"):
        load_model(ModelSettings(path=str(path), device="cpu", dtype="float32"))


def test_fast_bf16_and_free_ram_read_the_kernels_files(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n\nflags\t: fpu\n")
    assert fast_bf16_cpu(cpuinfo) == "avx512_bf16"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f amx_tile amx_bf16 avx512_bf16\n")
    assert fast_bf16_cpu(cpuinfo) == "amx_bf16"
    cpuinfo.write_text("flags\t\t: fpu sse avx2 avx512f\n")
    assert fast_bf16_cpu(cpuinfo) is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n")
    free = free_ram(meminfo)
    assert free is not None and free.bytes == 20_000_000 * 1024


def _gemma_folder() -> Path | None:
    """The Gemma 3 270M the playground fetched and converted (issue 34, point 1), if it is on this computer."""
    from playground.models.paths import models_dir

    for marker in sorted(models_dir().glob("gemma-3-270m*/playground-source.json")):
        gguf = marker.parent / str(json.loads(marker.read_text()).get("gguf", ""))
        if gguf.is_file() and (marker.parent / "model.safetensors").is_file():
            return marker.parent
    return None


@pytest.mark.model
@pytest.mark.skipif(_gemma_folder() is None, reason="Gemma 3 270M is not fetched")
def test_the_gemma_gguf_is_listed_as_gemma_3_in_ollama_and_lm_studio(tmp_path):
    from safetensors import safe_open

    folder = _gemma_folder()
    assert folder is not None
    source = json.loads((folder / "playground-source.json").read_text())
    gguf, digest = folder / source["gguf"], source["gguf_sha256"]
    _link(gguf, tmp_path / ".lmstudio" / "models" / "lmstudio-community" / "gemma-3-270m-GGUF" / gguf.name)
    ollama = tmp_path / ".ollama" / "models"
    _link(gguf, ollama / "blobs" / f"sha256-{digest}")
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / "gemma3" / "270m"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                                "digest": f"sha256:{digest}"}]}))
    found = scan(_stores_of(tmp_path))
    assert sorted((e.store, e.name) for e in found.entries) == [
        ("LM Studio", f"lmstudio-community/gemma-3-270m-GGUF/{gguf.name}"), ("Ollama", "gemma3:270m")]
    with safe_open(folder / "model.safetensors", "np") as weights:
        parameters = sum(prod(weights.get_slice(k).get_shape()) for k in weights.keys())  # noqa: SIM118
    for entry in found.entries:
        assert (entry.model_type, entry.family, entry.parameters, entry.views, entry.problem) == (
            "gemma3_text", "Gemma 3", parameters, "every view", None)
        assert entry.quantization == "Q4_K_M" and "q4_k_m" in gguf.name.lower()
        assert entry.file_bytes == gguf.stat().st_size
