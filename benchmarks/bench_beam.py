"""transformers' `generate` beam search vs the playground's instrumented beam search, side by side in one process.

Same model, device, prompt and settings (4 beams, 64 new tokens by default); runs alternate (A, B, A, B, ...) so
machine noise hits both, and the median of each is reported with the ratio. Wall time includes the prefill for
both; "tokens" are decoding steps (one new position for every beam), the same count for both since the two
searches return the same sequences (checked on every run). The playground's side consumes every event it yields
(the whole beam tree: 2 x width candidates a step, with their texts).

    .venv/bin/python benchmarks/bench_beam.py [--tiny] [--model PATH] [--beams 4] [--new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import time

from side_by_side import report

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import support_path  # noqa: F401  (tests/support on sys.path)
import torch

from playground.config import BeamSettings, ModelSettings, RunSettings
from playground.engine.beam import run_beam_search
from playground.engine.prompt import encode_prompt
from playground.events import BeamStep, RunFinished
from playground.models.loaded import LoadedModel

PROMPT = "Write a long story about a dragon who learns to bake bread."


def load(args: argparse.Namespace) -> LoadedModel:
    if args.tiny:
        from support.tiny_models import build_tiny_lm

        return build_tiny_lm(seed=0)
    from playground.models.default_model import fetch_default_model, is_default_model_ready
    from playground.models.loading import load_model

    if args.model is None and not is_default_model_ready():
        fetch_default_model()
    return load_model(ModelSettings(path=args.model, device=args.device, dtype=args.dtype))


def reference_beam(lm: LoadedModel, prompt_ids: list[int], s: RunSettings) -> tuple[list[int], int, float]:
    """(best sequence, steps, seconds) of transformers' own beam search."""
    ids = torch.tensor([prompt_ids], device=lm.device)
    early = {"true": True, "false": False, "never": "never"}[s.group(BeamSettings).early_stopping]
    start = time.perf_counter()
    beam = s.group(BeamSettings)
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=beam.num_beams,
                            max_new_tokens=s.max_new_tokens, length_penalty=beam.length_penalty, early_stopping=early,
                            return_dict_in_generate=True, output_scores=True)
    seconds = time.perf_counter() - start
    length = int((out.beam_indices[0] != -1).sum())
    best = out.sequences[0, len(prompt_ids) : len(prompt_ids) + length].tolist()
    steps = out.sequences.shape[1] - len(prompt_ids)  # = the longest hypothesis = decoding steps run
    return best, steps, seconds


def ours(lm: LoadedModel, s: RunSettings) -> tuple[list[int], int, float]:
    start = time.perf_counter()
    steps, done = 0, None
    for event in run_beam_search(lm, s):
        if isinstance(event, BeamStep):
            steps += 1
        elif isinstance(event, RunFinished):
            done = event
    seconds = time.perf_counter() - start
    assert done is not None
    return list(done.token_ids), steps, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny random model built in memory (no download)")
    parser.add_argument("--model", default=None, help="a model folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    lm = load(args)
    # early_stopping="never" with length penalty 1 keeps both searches going to the token limit on most prompts.
    settings = RunSettings.from_flat(strategy="beam", prompt=PROMPT, num_beams=args.beams,
                                     max_new_tokens=args.new_tokens, early_stopping="never")
    prompt_ids, _ = encode_prompt(lm, settings)
    warm = settings.replace(max_new_tokens=4)
    ours(lm, warm)  # warm-up both paths
    reference_beam(lm, prompt_ids, warm)

    ref_rates, our_rates = [], []
    for _ in range(args.repeats):
        best_ref, steps_ref, seconds = reference_beam(lm, prompt_ids, settings)
        ref_rates.append(steps_ref / seconds)
        best_ours, steps_ours, seconds = ours(lm, settings)
        our_rates.append(steps_ours / seconds)
        assert best_ours == best_ref, "both searches should return the same best sequence"
        assert steps_ours == steps_ref, f"both should run the same steps ({steps_ref} vs {steps_ours})"
    report(f"model {lm.name} on {lm.device} ({lm.dtype_name}), prompt {len(prompt_ids)} tokens, {args.beams} beams, "
           f"{steps_ref} steps, median of {args.repeats}", "steps/s", ("transformers generate beam search", ref_rates),
           ("playground instrumented beam", our_rates), goal=0.8)

if __name__ == "__main__":
    main()
