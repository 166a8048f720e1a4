"""Starting and stopping a real llama-server for the tests: the session fixture's, and the ones a test owns (to
kill it, or to run it with a draft model). It serves the default model's own Q4_1 GGUF on 127.0.0.1, on a free
port; its log goes to a file (an unread pipe would fill up and block the server)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def start_server(log_path: Path | None = None, *extra: str) -> tuple[subprocess.Popen, str]:
    """A started llama-server and its root URL; ``extra`` options may name the model file as ``{gguf}``."""
    from support.llama_build import cached_server

    from playground.models.default_model import ensure_default_gguf

    binary = cached_server()
    assert binary is not None, "llama-server is not built: run `make llama-server` (the README's test command does)"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gguf = str(ensure_default_gguf())
    command = [str(binary), "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-t", "2",
               "--metrics", "--no-warmup", *(a.replace("{gguf}", gguf) for a in extra)]
    log = log_path.open("w") if log_path is not None else subprocess.DEVNULL
    try:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    finally:
        if log_path is not None:
            log.close()  # the child holds its own handle
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as response:
                if response.status == 200:
                    return server, url
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            stop_server(server)
            said = log_path.read_text(errors="replace")[-2000:] if log_path is not None else ""
            raise RuntimeError(f"llama-server did not start: {said}")
        time.sleep(0.2)


def stop_server(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
