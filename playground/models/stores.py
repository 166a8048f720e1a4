"""The models already on this computer: the Hugging Face cache, LM Studio's and Ollama's stores, the playground's
own models and the folders the user added, each entry described from its ``config.json`` (and the safetensors
headers) or its GGUF header, without loading a weight.

Where each tool keeps its models (as each lays them out):

- Hugging Face: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` (``~/.cache``):
  ``models--ORG--NAME/snapshots/REVISION/`` (links into ``blobs/``), the revision ``refs/main`` names;
- LM Studio: ``~/.lmstudio/models/PUBLISHER/REPO/`` (the home may be moved: ``~/.lmstudio-home-pointer``; the models
  folder too: ``downloadsFolder`` in its ``settings.json``), and the older ``~/.cache/lm-studio/models``;
- Ollama: ``$OLLAMA_MODELS``, else ``~/.ollama/models`` (and the Linux service's ``/usr/share/ollama/.ollama/models``):
  ``manifests/registry.ollama.ai/library/NAME/TAG`` (JSON) naming the model layer's blob, ``blobs/sha256-HEX``;
- the folders the user added (``playground models --add DIR``, or the picker's "On this computer…"), searched a
  few levels deep for model folders and ``.gguf`` files.

Torch-free apart from the family table (``playground.models.anatomy``), imported when a family is looked up.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

from playground.errors import UserError
from playground.models.gguf_header import GGUFHeaderError, read_gguf_header
from playground.models.paths import models_dir

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# A GGUF's architecture -> the model_type transformers gives it (the names that differ; others are the same).
GGUF_MODEL_TYPES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "qwen2moe": "qwen2_moe",
                    "qwen3moe": "qwen3_moe", "minimax-m2": "minimax_m2", "gpt-oss": "gpt_oss"}
# The architectures transformers reads from a GGUF (transformers.integrations.ggml's GGUF_CONFIG_MAPPING, under
# the model_type names above); tests/test_stores.py checks the set against transformers'.
GGUF_LOADABLE = frozenset({"llama", "mistral", "qwen2", "qwen2_moe", "gpt_oss", "lfm2", "qwen3", "qwen3_moe",
                           "falcon", "phi3", "bloom", "t5", "stablelm", "gpt2", "starcoder2", "mamba", "nemotron",
                           "gemma2", "gemma3", "gemma4", "umt5", "deci", "minimax_m2"})
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_FOLDER_DEPTH = 4  # how deep an added folder is searched


class StoreError(UserError, ValueError):
    """A folder the user asked to add or remove is not usable; the message says why."""


@dataclass(frozen=True)
class Store:
    """A place models are kept: its kind (shown), its root folder."""

    kind: str  # "Hugging Face cache", "LM Studio", "Ollama", "Decoding Playground", "folder"
    root: Path


@dataclass(frozen=True)
class StoreEntry:
    """One model found: what ``--model`` takes (``path``) and what it is, read without loading its weights."""

    store: str
    name: str  # the tool's own name for it: ORG/NAME, PUBLISHER/REPO/FILE, NAME:TAG, a folder's name
    path: Path  # a model folder (config.json) or a GGUF file (an Ollama blob has no .gguf suffix)
    format: str  # "gguf" or "folder"
    model_type: str  # transformers' model_type ("llama", "gemma3_text", ...), "" when unknown
    family: str  # the family's display name (the anatomy table's), else the model_type
    parameters: int | None
    quantization: str  # Q4_K_M, BF16, "gptq 4-bit", ...
    file_bytes: int
    unsupported: tuple[str, ...] = ()  # the capabilities (views) its family does not support
    parameters_estimated: bool = False  # from the file size (a .bin checkpoint), not from the tensors' shapes
    problem: str | None = None  # why it cannot be opened here (None: it can)

    def memory_bytes(self, dtype: str) -> int | None:
        """The weights' bytes once loaded at ``dtype`` (float32, bfloat16, float16): GGUFs are dequantized."""
        if self.parameters is None:
            return None
        return self.parameters * DTYPE_BYTES[dtype]

    @property
    def views(self) -> str:
        if self.problem:
            return "none (cannot be opened here)"
        if not self.unsupported:
            return "every view"
        return "all but " + ", ".join(self.unsupported)


@dataclass(frozen=True)
class Scan:
    entries: tuple[StoreEntry, ...]
    stores: tuple[Store, ...]  # every store looked at (found or not)
    seconds: float
    skipped: tuple[str, ...] = ()  # files that looked like models but could not be read, with why


# --- where the stores are --------------------------------------------------------------------------------------
def hf_cache_dir(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(env.get("XDG_CACHE_HOME") or home / ".cache").expanduser() / "huggingface" / "hub"


def lmstudio_dirs(home: Path | None = None) -> list[Path]:
    home = Path.home() if home is None else home
    lms_home = home / ".lmstudio"
    pointer = home / ".lmstudio-home-pointer"
    try:
        if pointer.is_file() and pointer.read_text().strip():
            lms_home = Path(pointer.read_text().strip()).expanduser()
    except OSError:
        pass
    found = [lms_home / "models"]
    try:
        settings = json.loads((lms_home / "settings.json").read_text())
        moved = settings.get("downloadsFolder") if isinstance(settings, dict) else None
        if isinstance(moved, str) and moved:
            found.insert(0, Path(moved).expanduser())
    except (OSError, ValueError):
        pass
    found.append(home / ".cache" / "lm-studio" / "models")
    return list(dict.fromkeys(found))


def ollama_dirs(env: Mapping[str, str] | None = None, home: Path | None = None) -> list[Path]:
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    if env.get("OLLAMA_MODELS"):
        return [Path(env["OLLAMA_MODELS"]).expanduser()]
    return [home / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config").expanduser() / "decoding-playground"


def _folders_file(env: Mapping[str, str] | None = None) -> Path:
    return config_dir(env) / "model-folders.json"


def user_folders(env: Mapping[str, str] | None = None) -> list[Path]:
    try:
        data = json.loads(_folders_file(env).read_text())
    except (OSError, ValueError):
        return []
    folders = data.get("folders", []) if isinstance(data, dict) else []
    return [Path(f) for f in folders if isinstance(f, str)]


def add_user_folder(folder: str | Path, env: Mapping[str, str] | None = None) -> Path:
    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        raise StoreError(f"{folder} is not a folder: add a folder that holds models (folders or .gguf files)")
    _save_folders([*(f for f in user_folders(env) if f != path), path], env)
    return path


def remove_user_folder(folder: str | Path, env: Mapping[str, str] | None = None) -> Path:
    path = Path(folder).expanduser().resolve()
    kept = [f for f in user_folders(env) if f != path and f != Path(folder)]
    if len(kept) == len(user_folders(env)):
        raise StoreError(f"{folder} is not one of the added folders")
    _save_folders(kept, env)
    return path


def _save_folders(folders: list[Path], env: Mapping[str, str] | None) -> None:
    target = _folders_file(env)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(".tmp")
    temporary.write_text(json.dumps({"folders": [str(f) for f in folders]}, indent=2))
    temporary.replace(target)


def all_stores(env: Mapping[str, str] | None = None, home: Path | None = None) -> list[Store]:
    """Every store this computer could have, in the order they are listed (a store may not exist)."""
    found = [Store("Hugging Face cache", hf_cache_dir(env, home))]
    found += [Store("LM Studio", root) for root in lmstudio_dirs(home)]
    found += [Store("Ollama", root) for root in ollama_dirs(env, home)]
    if home is None:  # the playground's own (a test's made-up home has none)
        found.append(Store("Decoding Playground", models_dir()))
    found += [Store("folder", root) for root in user_folders(env)]
    return found


def scan(stores: Iterable[Store] | None = None) -> Scan:
    """Every model in ``stores`` (default: ``all_stores()``), each read without loading weights."""
    started = time.perf_counter()
    looked = tuple(all_stores() if stores is None else stores)
    entries: list[StoreEntry] = []
    skipped: list[str] = []
    seen: dict[Path, Store] = {}
    for store in looked:
        if not store.root.is_dir():
            continue
        walk = {"Hugging Face cache": _hf_entries, "LM Studio": _lmstudio_entries, "Ollama": _ollama_entries}.get(
            store.kind, _folder_entries)
        for item in walk(store):
            if isinstance(item, str):
                skipped.append(item)
                continue
            key = item.path.absolute()
            # An added folder inside a store: its models are listed once, under the first store (one store's two
            # names for one file, Ollama's `cp`, are both listed).
            if seen.setdefault(key, store) == store:
                entries.append(item)
    return Scan(tuple(entries), looked, time.perf_counter() - started, tuple(skipped))


# --- each store's layout ----------------------------------------------------------------------------------------
def _hf_entries(store: Store) -> Iterator[StoreEntry | str]:
    for repo in sorted(store.root.glob("models--*")):
        snapshot = _hf_snapshot(repo)
        if snapshot is None:
            continue
        repo_id = repo.name[len("models--"):].replace("--", "/")
        if (snapshot / "config.json").is_file():
            yield _described(describe_folder, snapshot, store.kind, repo_id)
        else:
            for gguf in sorted(snapshot.rglob("*.gguf")):
                yield _described(describe_gguf, gguf, store.kind, f"{repo_id}/{gguf.relative_to(snapshot)}")


def _hf_snapshot(repo: Path) -> Path | None:
    """The snapshot ``refs/main`` names, else the newest one."""
    try:
        revision = (repo / "refs" / "main").read_text().strip()
        if revision and (repo / "snapshots" / revision).is_dir():
            return repo / "snapshots" / revision
    except OSError:
        pass
    snapshots = [s for s in (repo / "snapshots").glob("*") if s.is_dir()]
    return max(snapshots, key=lambda s: s.stat().st_mtime) if snapshots else None


def _lmstudio_entries(store: Store) -> Iterator[StoreEntry | str]:
    for repo in sorted(p for p in store.root.glob("*/*") if p.is_dir()):
        name = f"{repo.parent.name}/{repo.name}"
        if (repo / "config.json").is_file():  # an MLX or safetensors download
            yield _described(describe_folder, repo, store.kind, name)
            continue
        for gguf in sorted(repo.glob("*.gguf")):
            if not _not_a_model_name(gguf.name):
                yield _described(describe_gguf, gguf, store.kind, f"{name}/{gguf.name}")


def _ollama_entries(store: Store) -> Iterator[StoreEntry | str]:
    manifests = store.root / "manifests"
    for manifest in sorted(p for p in manifests.glob("*/*/*/*") if p.is_file()):
        host, namespace, model, tag = manifest.relative_to(manifests).parts
        name = f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
        if host != "registry.ollama.ai":
            name = f"{host}/{name}"
        try:
            layers = json.loads(manifest.read_text()).get("layers", [])
            digest = next(layer["digest"] for layer in layers
                          if layer.get("mediaType") == "application/vnd.ollama.image.model")
        except (OSError, ValueError, AttributeError, KeyError, TypeError, StopIteration):
            yield f"{manifest}: an Ollama manifest without a model layer"
            continue
        blob = store.root / "blobs" / str(digest).replace(":", "-")
        if not blob.is_file():
            yield f"{manifest}: its model layer {digest} is not in blobs/"
            continue
        yield _described(describe_gguf, blob, store.kind, name)


def ollama_name(blob: Path) -> str | None:
    """The NAME:TAG an Ollama blob is stored under (its store's manifests), or None for a file outside one."""
    if blob.parent.name != "blobs" or not blob.name.startswith("sha256-"):
        return None
    for entry in _ollama_entries(Store("Ollama", blob.parent.parent)):
        if isinstance(entry, StoreEntry) and entry.path == blob:
            return entry.name
    return None


def _folder_entries(store: Store) -> Iterator[StoreEntry | str]:
    root = store.root
    for here, dirs, files in os.walk(root, followlinks=True):
        folder = Path(here)
        depth = len(folder.relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < _FOLDER_DEPTH else []
        name = str(folder.relative_to(root)) if folder != root else folder.name
        if "config.json" in files and any(f.endswith(_WEIGHT_SUFFIXES) for f in files):
            dirs[:] = []  # a model folder: what is below it is its own
            yield _described(describe_folder, folder, store.kind, name)
            continue
        for file in sorted(files):
            if file.lower().endswith(".gguf") and not _not_a_model_name(file):
                yield _described(describe_gguf, folder / file, store.kind, str((folder / file).relative_to(root)))


def _not_a_model_name(name: str) -> bool:
    """A vision projector (``mmproj-*.gguf``), or a split GGUF's later part (its first part stands for all)."""
    split = _SPLIT.search(name)
    return name.lower().startswith("mmproj") or (split is not None and int(split[1]) != 1)


def _described(describe_one: Callable[[Path, str, str], StoreEntry], path: Path, store: str,
               name: str) -> StoreEntry | str:
    """The entry, or why the file that looked like a model could not be read."""
    try:
        return describe_one(path, store, name)
    except (OSError, ValueError) as error:  # GGUFHeaderError is a ValueError
        return str(error)


# --- describing one model -----------------------------------------------------------------------------------------
_CACHE: dict[tuple[str, int, int, str, str], StoreEntry] = {}


def describe_gguf(path: Path, store: str = "file", name: str | None = None) -> StoreEntry:
    """A GGUF file from its header (cached by path, size and time: a rescan reads only what changed)."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns, store, name or "")
    if key in _CACHE:
        return _CACHE[key]
    header = read_gguf_header(path)
    if header.get("general.type") == "mmproj" or header.architecture == "clip":
        raise GGUFHeaderError(f"{path}: a vision projector (mmproj), not a language model")
    arch = header.architecture
    model_type = GGUF_MODEL_TYPES.get(arch, arch)
    if model_type == "llama" and "mistral" in str(header.get("general.name", "")).lower():
        model_type = "mistral"  # llama.cpp writes Mistral as llama; transformers tells them apart by name
    problem = None
    size = stat.st_size
    split = _SPLIT.search(path.name)
    if split:
        problem = f"a split GGUF (part {int(split[1])} of {int(split[2])}): transformers reads one-file GGUFs"
        size = sum(p.stat().st_size for p in path.parent.glob(_SPLIT.sub("-*-of-" + split[2] + ".gguf", path.name)))
    elif model_type not in GGUF_LOADABLE and arch not in GGUF_LOADABLE:
        problem = f"transformers cannot read the {arch or 'unnamed'} architecture from a GGUF"
    family, unsupported = family_support(model_type, kv=bool(header.get("{arch}.attention.head_count")))
    entry = StoreEntry(store=store, name=name or path.name, path=path, format="gguf", model_type=model_type,
                       family=family, parameters=header.parameters, quantization=header.quantization,
                       file_bytes=size, unsupported=unsupported, problem=problem)
    _CACHE[key] = entry
    return entry


def describe_folder(folder: Path, store: str = "folder", name: str | None = None) -> StoreEntry:
    """A Hugging Face model folder from its config.json and the safetensors headers (the weights unread)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{folder}: config.json cannot be read ({error})") from error
    if not isinstance(config, dict):
        raise ValueError(f"{folder}: config.json is not a JSON object")
    text: dict[str, Any] = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    model_type = str(config.get("model_type", ""))
    weights = _weight_files(folder)
    size = sum(p.stat().st_size for p in weights)
    parameters: int | None = None
    estimated = False
    dtypes: Counter[str] = Counter()
    safetensors = [p for p in weights if p.suffix == ".safetensors"]
    if safetensors:
        parameters = 0
        for path in safetensors:
            for dtype, count in _safetensors_counts(path):
                parameters += count
                dtypes[dtype] += count
    elif weights:
        declared = str(config.get("dtype") or config.get("torch_dtype") or "float32")
        parameters = size // DTYPE_BYTES.get(declared, 4)
        dtypes[declared] = parameters
        estimated = True
    problem = None
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method", "quantized"))
        bits = quant.get("bits") or quant.get("w_bit")
        quantization = f"{method} {bits}-bit" if bits else method
        problem = f"quantized with {method}: loading it needs that method's library (not in the playground)"
    else:
        quantization = _DTYPE_NAMES.get(dtypes.most_common(1)[0][0], "?") if dtypes else "?"
    if not weights:
        problem = "no weights (.safetensors or .bin) in the folder"
    architectures = [str(a) for a in config.get("architectures") or []]
    if architectures and not any(a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"))
                                 for a in architectures):
        problem = f"{', '.join(architectures)} is not a causal language model"
    family, unsupported = family_support(model_type, kv=bool(text.get("num_attention_heads")))
    if config.get("auto_map"):
        family += " (ships its own code)"
    return StoreEntry(store=store, name=name or folder.name, path=folder, format="folder", model_type=model_type,
                      family=family, parameters=parameters, quantization=quantization, file_bytes=size,
                      unsupported=unsupported, parameters_estimated=estimated, problem=problem)


def describe(path: Path) -> StoreEntry:
    """A model folder or a GGUF file, whichever ``path`` is."""
    return describe_folder(path) if path.is_dir() else describe_gguf(path)


_DTYPE_NAMES = {"F32": "F32", "F16": "F16", "BF16": "BF16", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
                "F8_E4M3": "FP8", "F8_E5M2": "FP8", "I8": "I8", "U8": "U8"}


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return [folder / s for s in shards if (folder / s).is_file()]
        except (OSError, ValueError, KeyError, AttributeError):
            pass
    safetensors = sorted(folder.glob("*.safetensors"))
    if safetensors:
        return safetensors
    return sorted(p for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth") and p.is_file()
                  and not p.name.startswith(("training_args", "optimizer", "scheduler", "rng_state")))


def _safetensors_counts(path: Path) -> Iterator[tuple[str, int]]:
    """(dtype, elements) per tensor, from the file's JSON header (its first 8 bytes give the header's length)."""
    with path.open("rb") as file:
        head = file.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its header)")
        (length,) = struct.unpack("<Q", head)
        if length > 100_000_000:
            raise ValueError(f"{path}: not a safetensors file (a header of {length} bytes)")
        header = json.loads(file.read(length))
    for name, tensor in header.items():
        if name != "__metadata__":
            yield str(tensor["dtype"]), prod(tensor["shape"])


def family_support(model_type: str, *, kv: bool) -> tuple[str, tuple[str, ...]]:
    """The family's display name and the capabilities it does not support (``anatomy.model_support``'s rule:
    a family of the table supports every one; outside it, the KV lab still runs where the KV geometry is known)."""
    from playground.models.anatomy import CAPABILITIES, FAMILIES

    row = FAMILIES.get(model_type)
    if row is not None:
        return row.name, ()
    blocked = tuple(cap for cap in CAPABILITIES if not (cap == "KV lab" and kv))
    return model_type or "unknown", blocked


# --- figures for people ----------------------------------------------------------------------------------------
def human_bytes(count: int | None) -> str:
    """1.2 GB, 538 MB, 704 B (decimal units, as file managers show sizes)."""
    if count is None:
        return "?"
    value, unit = float(count), "B"
    for bigger in ("KB", "MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.0f} {unit}" if unit == "B" or value >= 10 else f"{value:.1f} {unit}"


def human_count(count: int | None, estimated: bool = False) -> str:
    if count is None:
        return "?"
    if count >= 1e9:
        text = f"{count / 1e9:.2f} B"
    elif count >= 1e6:
        text = f"{count / 1e6:.0f} M" if count >= 1e7 else f"{count / 1e6:.1f} M"
    else:
        text = f"{count / 1e3:.0f} K"
    return f"~{text}" if estimated else text


def entry_row(entry: StoreEntry, dtype: str) -> dict[str, str]:
    """An entry's columns as the CLI and the picker show them."""
    return {"name": entry.name, "store": entry.store, "family": entry.family,
            "parameters": human_count(entry.parameters, entry.parameters_estimated),
            "quantization": entry.quantization, "file": human_bytes(entry.file_bytes),
            f"memory ({dtype})": human_bytes(entry.memory_bytes(dtype)), "views": entry.views,
            "path": str(entry.path)}
