"""transformers 4.46's constrained beam search (``generate(force_words_ids=...)``) vs the playground's
``--force-words``, on the same prompts, forced words, beams and lengths (tests/support/forced_beam_cases.py's
default-model cases), the default model on the CPU in float32.

transformers 5.x no longer has constrained beam search, so the reference runs in the separate 4.46 venv (a child
process, see tests/support/record_forced_beam_446.py): it loads the model once, decodes every case ``--repeats``
times and prints its sequences and seconds; then this process does the same with the playground (consuming every
event: the tree's candidates, the banks). The sequences must be equal; the figure is the median over repeats of
each case's tokens per second (decoding steps / wall seconds, prefill included), and their ratio. The two do not
alternate run by run (two processes), so machine noise can favour either: run it on a quiet machine.

    .venv/bin/python benchmarks/bench_forced_beam.py [--venv446 /work/venv446/bin/python] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import support_path  # noqa: F401  (tests/support on sys.path)
from side_by_side import report
from support.forced_beam_cases import DEFAULT_CASES

ROOT = Path(__file__).resolve().parent.parent


def reference_worker(folder: str, repeats: int) -> None:
    """Runs under transformers 4.46: each case's sequences and seconds, as JSON lines."""
    import torch
    from support.record_forced_beam_446 import force_ids
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    config = LlamaConfig.from_pretrained(folder)
    config.rope_theta = json.loads((Path(folder) / "config.json").read_text())["rope_parameters"]["rope_theta"]
    model = LlamaForCausalLM.from_pretrained(folder, config=config, torch_dtype=torch.float32).eval()
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(Path(folder) / "tokenizer.json"), eos_token="<|im_end|>")
    for prompt, words, beams, tokens, returns in DEFAULT_CASES:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=beams,
                                     force_words_ids=force_ids(tokenizer, words), max_new_tokens=tokens,
                                     num_return_sequences=returns, do_sample=False, pad_token_id=2,
                                     temperature=None, top_p=None, top_k=None)
            seconds.append(time.perf_counter() - start)
        print(json.dumps({"prompt": prompt, "seconds": seconds,
                          "best": out[0, ids.shape[1]:].tolist()}), flush=True)


def ours(repeats: int) -> list[dict]:
    from playground.config import ModelSettings, RunSettings
    from playground.engine.strategies import run_strategy
    from playground.events import BeamStep, RunFinished
    from playground.models.loading import load_model

    lm = load_model(ModelSettings(device="cpu", dtype="float32"))
    results = []
    for prompt, words, beams, tokens, returns in DEFAULT_CASES:
        settings = RunSettings.from_flat(prompt=prompt, chat=False, strategy="beam", num_beams=beams,
                                         max_new_tokens=tokens, force_words=words, num_return_sequences=returns)
        seconds, steps, best = [], 0, []
        for _ in range(repeats):
            start = time.perf_counter()
            steps = 0
            for event in run_strategy(lm, settings):
                steps += isinstance(event, BeamStep)
                if isinstance(event, RunFinished):
                    best = list(event.sequences[0].token_ids)
            seconds.append(time.perf_counter() - start)
        results.append({"prompt": prompt, "seconds": seconds, "steps": steps, "best": best})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv446", default="/work/venv446/bin/python", help="a python with transformers 4.46")
    parser.add_argument("--model", default=str(Path.home() / ".cache/decoding-playground/models/SmolLM2-135M-Instruct"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        reference_worker(args.model, args.repeats)
        return
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (ROOT, ROOT / 'tests', ROOT / 'benchmarks'))}
    child = subprocess.run([args.venv446, __file__, "--worker", "--model", args.model, "--repeats",
                            str(args.repeats)], capture_output=True, text=True, env=env, check=True)
    reference = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    mine = ours(args.repeats)
    ref_rates, our_rates = [], []
    for theirs, ours_case in zip(reference, mine, strict=True):
        # 4.46 pads after the first EOS; ours ends there
        assert theirs["best"][: len(ours_case["best"])] == ours_case["best"], (theirs, ours_case)
        # the same search runs the same steps (4.46's output length counts its padding instead)
        ref_rates.append(ours_case["steps"] / statistics.median(theirs["seconds"]))
        our_rates.append(ours_case["steps"] / statistics.median(ours_case["seconds"]))
        print(f"{theirs['prompt']!r}: 4.46 {ref_rates[-1]:.1f} steps/s, ours {our_rates[-1]:.1f} steps/s "
              f"({ours_case['steps']} steps)")
    report(f"constrained beam search, {len(DEFAULT_CASES)} cases x {args.repeats} repeats (per case: median)",
           "steps/s", ("transformers 4.46 generate(force_words_ids)", ref_rates),
           ("playground --force-words (all events)", our_rates), goal=0.8)


if __name__ == "__main__":
    sys.exit(main())
