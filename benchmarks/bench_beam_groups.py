"""transformers 4.46's diverse (group) beam search vs the playground's, on the same prompts and settings.

4.46 (the last transformers with ``num_beam_groups`` in its core ``generate``) lives in its own venv, so its side runs
in a child process of that venv's Python (``--ref-python``), which loads the default model the way
tests/support/record_group_beam_446.py does (``rope_theta`` set by hand) and answers one generate per request; the
two sides alternate (A, B, A, B, ...) so machine noise hits both, with the same thread count. Wall time includes the
prefill for both; "steps" are decoding steps (one new position for every beam), the same count for both since the
searches return the same sequences (checked on every run). The playground's side consumes every event it yields.

    .venv/bin/python benchmarks/bench_beam_groups.py [--ref-python /work/venv446/bin/python] [--new-tokens 32]
        [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from side_by_side import report

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from playground.config import ModelSettings, RunSettings
from playground.engine.prompt import encode_prompt
from playground.engine.strategies import run_strategy
from playground.events import BeamStep, RunFinished
from playground.models.default_model import default_model_dir
from playground.models.loaded import LoadedModel
from playground.models.loading import load_model

# (prompt, num_beams, num_beam_groups, diversity_penalty)
CASES = (("The capital of Australia is", 4, 2, 2.0), ("Three ideas for a birthday party:", 6, 3, 1.5))

# The 4.46 side: reads one JSON request per line, answers with the generated ids and the seconds generate took.
REFERENCE = r"""
import json, sys, time
from pathlib import Path
import torch
from transformers import LlamaConfig, LlamaForCausalLM
folder, threads = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(threads)
config = LlamaConfig.from_pretrained(folder)
config.rope_theta = json.loads((Path(folder) / "config.json").read_text())["rope_parameters"]["rope_theta"]
model = LlamaForCausalLM.from_pretrained(folder, config=config, torch_dtype=torch.float32).eval()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    r = json.loads(line)
    ids = torch.tensor([r["prompt_ids"]])
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=r["beams"],
                             num_beam_groups=r["groups"], diversity_penalty=r["penalty"], do_sample=False,
                             max_new_tokens=r["new_tokens"], eos_token_id=r["eos"], pad_token_id=r["eos"],
                             temperature=None, top_p=None, top_k=None)
    seconds = time.perf_counter() - start
    print(json.dumps({"ids": out[0, ids.shape[1]:].tolist(), "seconds": seconds}), flush=True)
"""


class Reference:
    def __init__(self, python: str, folder: Path, threads: int) -> None:
        self.child = subprocess.Popen([python, "-c", REFERENCE, str(folder), str(threads)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert json.loads(self._line())["ready"]

    def _line(self) -> str:
        assert self.child.stdout is not None
        line = self.child.stdout.readline()
        if not line:
            raise RuntimeError("the 4.46 side ended early (see its stderr above)")
        return line

    def run(self, request: dict) -> tuple[list[int], float]:
        assert self.child.stdin is not None
        self.child.stdin.write(json.dumps(request) + "\n")
        self.child.stdin.flush()
        answer = json.loads(self._line())
        return answer["ids"], answer["seconds"]

    def close(self) -> None:
        assert self.child.stdin is not None
        self.child.stdin.close()
        self.child.wait(timeout=60)


def ours(lm: LoadedModel, s: RunSettings) -> tuple[list[int], int, float]:
    start = time.perf_counter()
    steps, done = 0, None
    for event in run_strategy(lm, s):
        if isinstance(event, BeamStep):
            steps += 1
        elif isinstance(event, RunFinished):
            done = event
    seconds = time.perf_counter() - start
    assert done is not None
    return list(done.token_ids), steps, seconds


def trimmed(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref-python", default="/work/venv446/bin/python", help="a Python with transformers 4.46")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    folder = default_model_dir()
    lm = load_model(ModelSettings(path=str(folder), device="cpu", dtype="float32"))
    eos = lm.eos_token_ids[0]
    reference = Reference(args.ref_python, folder, args.threads)
    try:
        for prompt, beams, groups, penalty in CASES:
            settings = RunSettings.from_flat(strategy="beam", prompt=prompt, chat=False, num_beams=beams,
                                             num_beam_groups=groups, diversity_penalty=penalty,
                                             max_new_tokens=args.new_tokens)
            prompt_ids, _ = encode_prompt(lm, settings)
            request = {"prompt_ids": prompt_ids, "beams": beams, "groups": groups, "penalty": penalty,
                       "new_tokens": args.new_tokens, "eos": eos}
            ours(lm, settings.replace(max_new_tokens=4))  # warm-up both sides
            reference.run({**request, "new_tokens": 4})
            ref_rates, our_rates = [], []
            for _ in range(args.repeats):
                ref_ids, seconds = reference.run(request)
                ref_steps = len(ref_ids)
                ref_rates.append(ref_steps / seconds)
                our_ids, steps, seconds = ours(lm, settings)
                our_rates.append(steps / seconds)
                assert our_ids == trimmed(ref_ids, eos), "both searches should return the same best sequence"
            report(f"{lm.name} on cpu (float32, {args.threads} thread(s)), {prompt!r}: {len(prompt_ids)} prompt "
                   f"tokens, {beams} beams in {groups} groups, D={penalty:g}, {steps} steps, median of "
                   f"{args.repeats}", "steps/s", ("transformers 4.46 generate (group beam search)", ref_rates),
                   ("playground diverse beam search (instrumented)", our_rates), goal=0.8)
    finally:
        reference.close()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
