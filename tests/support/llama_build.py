"""llama.cpp's ``llama-server``, built once per machine from a pinned source into the user cache.

The source is the llama.cpp that the ``llama-cpp-python`` sdist vendors (PyPI has no CPU wheel with the server).
Only the ``llama-server`` target is built, statically, for the x86-64 AVX2 baseline without AMX: some of these
machines advertise AMX but trap on its instructions, and a CI machine may be another CPU than the one that built it.
``PYTHONPATH=tests python -m support.llama_build`` (``make llama-server``) builds it if missing and prints its path
last. The app does not need it (a server is any URL the user gives); the remote-model tests and
``benchmarks/bench_remote.py`` do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from playground.models.paths import cache_root

SOURCE = "llama-cpp-python==0.3.36"
ENV_OVERRIDE = "PLAYGROUND_LLAMA_SERVER"  # a llama-server binary to use instead of building one
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
    "-DGGML_AVX512=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
    "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_APP=OFF",
)

Say = Callable[[str], None]


class BuildError(RuntimeError):
    """Building llama-server failed; the message says where and what to try."""


def server_dir() -> Path:
    return cache_root() / "llama-server" / SOURCE.split("==")[1]


def cached_server() -> Path | None:
    """The llama-server to use: ``$PLAYGROUND_LLAMA_SERVER``, else the one built into the cache, else None."""
    override = os.environ.get(ENV_OVERRIDE)
    if override:
        return Path(override) if Path(override).is_file() else None
    binary = server_dir() / "llama-server"
    return binary if binary.is_file() else None


def _run(command: list[str], log: Path, what: str) -> None:
    with log.open("a") as output:
        result = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = " / ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
        raise BuildError(f"{what} failed (exit {result.returncode}): {tail}. The full log is {log}")


def build_server(say: Say = print) -> Path:
    """Download the pinned source, build the ``llama-server`` target, install it into the cache; its path."""
    target = server_dir()
    target.mkdir(parents=True, exist_ok=True)
    log = target / "build.log"
    log.write_text("")
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise BuildError(f"building llama-server needs {tool}: install it (Debian: apt-get install cmake g++)")
    with tempfile.TemporaryDirectory(prefix="llama-build-") as tmp:
        work = Path(tmp)
        say(f"downloading {SOURCE} (the llama.cpp source it vendors)…")
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              "--disable-pip-version-check", "-d", str(work), SOURCE], log, "pip download")
        archive = next(work.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        source = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
        build = work / "build"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        say("configuring (cmake)…")
        _run(["cmake", "-S", str(source), "-B", str(build), *generator, *CMAKE_FLAGS], log, "cmake configure")
        say(f"building llama-server on {os.cpu_count()} cores (about 7 minutes on 2)…")
        _run(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(os.cpu_count() or 2)], log,
             "cmake build")
        binary = build / "bin" / "llama-server"
        if not binary.is_file():
            raise BuildError(f"the build finished without {binary}; the log is {log}")
        staged = target / "llama-server.partial"
        shutil.copy2(binary, staged)
        staged.rename(target / "llama-server")  # a half-copied binary is never "built"
    return target / "llama-server"


def ensure_server(say: Say = print) -> Path:
    return cached_server() or build_server(say)


def main() -> int:
    try:
        path = ensure_server(lambda message: print(message, file=sys.stderr))
    except BuildError as error:
        print(f"playground: error: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
