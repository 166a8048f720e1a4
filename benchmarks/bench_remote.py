"""A remote run through the playground vs a bare client on the same llama-server stream, and llama-server vs our
local engine on the same weights, side by side in one run.

1. Engine path: ``run_remote`` (what the window runs: engine detection, the stream read on a helper thread, every
   chunk turned into a token event, the server's extras after the run) vs the ``openai`` client alone reading the
   same request's stream. Goal: >= 0.95x.
2. Decode speed: llama-server's greedy (Q4_1 GGUF, llama.cpp's kernels) vs our local engine's greedy on the same
   weights dequantized to float32 (transformers). Both on this machine's CPU, one at a time.
3. Agreement: greedy tokens the two agree on before they part, and the gap of the chosen tokens' probabilities.

Rates are wall-clock tokens per second from the request to the last token (prefill included, for both sides).

    .venv/bin/python benchmarks/bench_remote.py [--base-url URL] [--new-tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import support_path  # noqa: F401  (tests/support on sys.path)
from side_by_side import report

from playground.config import RunSettings
from playground.events import RunFinished, TokenStep
from playground.remote.client import detect_engine, open_client, request_headers
from playground.remote.decode import run_remote
from playground.remote.request import build_request
from playground.remote.source import RemoteSource

PROMPT = "Write a long story about a dragon who learns to bake bread."
AGREEMENT_PROMPTS = [("def fibonacci(n):", False), ("The capital of France is", False),
                     ("Write a haiku about the sea.", True), ("What is the capital of France?", True),
                     ("List three primary colours.", True)]


def start_server() -> tuple[subprocess.Popen, str]:
    from support.llama_build import ensure_server

    from playground.models.default_model import ensure_default_gguf

    binary = ensure_server(lambda message: print(message, file=sys.stderr))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([str(binary), "-m", str(ensure_default_gguf()), "--host", "127.0.0.1", "--port",
                               str(port), "-c", "4096", "-t", "2", "--metrics", "--no-warmup"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return server, url
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("llama-server did not start")


def ours(source: RemoteSource, settings: RunSettings) -> tuple[int, float]:
    start = time.perf_counter()
    done = next(e for e in run_remote(source, settings) if isinstance(e, RunFinished))
    return len(done.token_ids), time.perf_counter() - start


def bare(source: RemoteSource, settings: RunSettings) -> tuple[int, float]:
    """The same request read by the ``openai`` client alone: count the tokens, nothing else."""
    info = detect_engine(source)
    request = build_request(settings, info, info.models[0], source)
    client = open_client(source)
    start = time.perf_counter()
    tokens = 0
    routes = {"chat/completions": client.chat.completions.create, "completions": client.completions.create}
    for chunk in routes[request.endpoint](**request.kwargs, extra_headers=request_headers(source)):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens += len(chunk.choices[0].logprobs.content or ())
    elapsed = time.perf_counter() - start
    client.close()
    return tokens, elapsed


def local(lm, settings: RunSettings) -> tuple[int, float]:
    from playground.engine.strategies import run_strategy

    start = time.perf_counter()
    done = next(e for e in run_strategy(lm, settings) if isinstance(e, RunFinished))
    return len(done.token_ids), time.perf_counter() - start


def agreement(lm, source: RemoteSource, new_tokens: int) -> None:
    from playground.engine.strategies import run_strategy

    print("\ngreedy agreement, llama-server vs local engine (same Q4_1 weights; llama.cpp quantizes activations)")
    gaps: list[float] = []
    for prompt, chat in AGREEMENT_PROMPTS:
        settings = RunSettings(prompt=prompt, chat=chat, max_new_tokens=new_tokens, num_candidates=5)
        mine = [e for e in run_strategy(lm, settings) if isinstance(e, TokenStep)]
        theirs = [e for e in run_remote(source, settings) if isinstance(e, TokenStep)]
        same = 0
        note = "agree to the end"
        for a, b in zip(mine, theirs, strict=False):
            if a.token_id != b.token_id:
                pick = {c.token_id: c.raw_prob for c in a.candidates}
                note = (f"part at step {a.step}: local {a.text!r} p={a.raw_prob:.3f}, server {b.text!r} "
                        f"(local p={pick.get(b.token_id, float('nan')):.3f}, server p={b.raw_prob:.3f})")
                break
            same += 1
            gaps.append(abs(a.raw_prob - b.raw_prob))
        print(f"  {prompt!r:34} {'chat' if chat else 'raw '}  {same:3d}/{min(len(mine), len(theirs))} tokens; {note}")
    print(f"  chosen-token probability gap on agreed tokens: max {max(gaps):.3f}, mean {statistics.mean(gaps):.4f}, "
          f"median {statistics.median(gaps):.4f} ({len(gaps)} tokens)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="an already running llama-server (default: start one)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-local", action="store_true", help="skip the local engine (no torch)")
    args = parser.parse_args()
    server = None
    url = args.base_url
    if url is None:
        server, url = start_server()
    try:
        source = RemoteSource(base_url=url).validate()
        settings = RunSettings(prompt=PROMPT, chat=True, max_new_tokens=args.new_tokens, num_candidates=10)
        ours(source, settings.replace(max_new_tokens=4))  # warm-up: the server's prompt cache, our imports
        bare(source, settings.replace(max_new_tokens=4))
        runs: dict[str, list[float]] = {"bare": [], "ours": [], "local": []}
        lm = None
        if not args.no_local:
            from playground.config import ModelSettings
            from playground.models.default_model import fetch_default_model
            from playground.models.loading import load_model

            fetch_default_model()
            lm = load_model(ModelSettings(device="cpu", dtype="float32"))
            local(lm, settings.replace(max_new_tokens=4))
        for _ in range(args.repeats):  # alternate, so machine noise hits every side
            for name, run in (("bare", lambda: bare(source, settings)), ("ours", lambda: ours(source, settings)),
                              ("local", (lambda: local(lm, settings)) if lm is not None else None)):
                if run is None:
                    continue
                tokens, seconds = run()
                runs[name].append(tokens / seconds)
        print(f"llama-server {url}, SmolLM2-135M Q4_1, chat prompt, {args.new_tokens} new tokens, "
              f"{settings.num_candidates} candidates per token")
        report("\nengine path: run_remote vs a bare openai client on the same stream", "tok/s",
               ("bare openai client", runs["bare"]), ("run_remote (window's path)", runs["ours"]), goal=0.95)
        if lm is not None:
            report("\ndecode speed: local engine (transformers fp32) vs llama-server (llama.cpp Q4_1)", "tok/s",
                   ("local engine, fp32", runs["local"]), ("llama-server via run_remote", runs["ours"]), goal=1.0)
            agreement(lm, source, 32)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)


if __name__ == "__main__":
    main()
