"""Adaptive-P against the real llama-server (the llama.cpp that llama-cpp-python 0.3.36 vendors has it): a
generation of several tokens with min-p then Adaptive-P; at each step llama-server's own raw distribution (its top
tokens: min-p keeps fewer) goes through our chain, our moving average following llama-server's chosen tokens, and
our transformed probabilities must be its post-sampler ones, step after step: the average's trajectory (which sets
each step's target) is llama.cpp's. (Our model's own raw distribution differs from its Q4_1 one by up to ~0.03,
which the steep transform can turn into ~0.15: the comparison takes the server's raw numbers.)"""

from __future__ import annotations

import json
import math
import urllib.request

import pytest
import torch

from playground.config import RunSettings
from playground.engine.processors import SamplerRun, build_pipeline, run_pipeline

pytestmark = pytest.mark.model

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
TOKENS = 10
TOP = 20  # the post-sampler probabilities compared per step
RAW_TOP = 200  # the raw ones read (min-p keeps fewer: its whole set is known)


def completion(url: str, body: dict) -> dict:
    request = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    # Once in a full run (2 workers, the session's server used by earlier tests) an answer came back without its
    # probabilities; the cause is not known (an end-of-generation draw does not explain it: such an answer still
    # has them). The request reads only, so it is asked once more; a second such answer fails with what was sent.
    for _ in range(2):
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.loads(response.read())
        if "completion_probabilities" in answer:
            return answer
    raise AssertionError(f"llama-server answered twice without probabilities: {answer!r:.600}")


@pytest.mark.parametrize(("target", "decay"), [(0.3, 0.7), (0.6, 0.9)])
def test_transformed_distributions_and_the_average_follow_llama_server(llama_server_url, default_lm, target, decay):
    tokenizer = default_lm.tokenizer
    settings = RunSettings.from_flat(strategy="sample", min_p=0.05, adaptive_target=target, adaptive_decay=decay,
                                     samplers="min_p;adaptive_p").validate()
    compared, moved = 0, 0
    for seed, prompt in enumerate(PROMPTS):
        ids = tokenizer(prompt)["input_ids"]
        theirs = completion(llama_server_url, {
            "prompt": ids, "n_predict": TOKENS, "n_probs": TOP, "samplers": ["min_p", "adaptive_p"], "min_p": 0.05,
            "adaptive_target": target, "adaptive_decay": decay, "post_sampling_probs": True, "seed": seed,
            "temperature": 1.0})["completion_probabilities"]
        run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=True)
        pipeline = build_pipeline(settings, sampling=True, run=run)
        adaptive = pipeline[-1]
        for step in theirs:
            # Seeded, so the one token the server draws is the same every run (the raw top_probs do not depend on it).
            raw = completion(llama_server_url, {"prompt": ids, "n_predict": 1, "n_probs": RAW_TOP, "samplers": [],
                                                "post_sampling_probs": True, "seed": 0})["completion_probabilities"][0]
            logits = torch.full((1, len(tokenizer)), -math.inf, dtype=torch.float64)
            for t in raw["top_probs"]:
                logits[0, t["id"]] = math.log(max(t["prob"], 1e-30))
            kept_by_min_p = sum(t["prob"] >= 0.05 * raw["top_probs"][0]["prob"] for t in raw["top_probs"])
            before = adaptive.adapted()
            processed = run_pipeline(pipeline, torch.tensor([ids]), logits).softmax(-1)[0]
            assert kept_by_min_p < RAW_TOP  # min-p's set lies within the raw tokens the server sent: all known
            for t in step["top_probs"]:
                assert abs(float(processed[t["id"]]) - t["prob"]) < 2e-3, (prompt, len(ids), t, before)
            compared += 1
            chosen = step["id"]
            run.accept(chosen, float(processed[chosen]))
            moved += abs(adaptive.adapted() - target) > 0.02
            ids = [*ids, chosen]
    assert compared == len(PROMPTS) * TOKENS, compared
    assert moved >= 5, "precondition: the adapted target moved away from the target on several steps"
