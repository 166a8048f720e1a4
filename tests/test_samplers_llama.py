"""Our samplers against llama.cpp's on the real model: llama-server serves the default model's own GGUF and sends
its post-sampler probabilities (``post_sampling_probs``); where the two engines' raw distributions agree closely,
the tokens each sampler keeps must be the same."""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch

from playground.config import RunSettings
from playground.engine.processors import SamplerRun, build_pipeline, run_pipeline

pytestmark = pytest.mark.model

TOP = 20  # the raw candidates compared, per step
RAW_GAP = 0.03  # the steps compared: no raw probability among them differs by more than this between the engines
# (our setting, llama-server's sampler name and its parameters)
SAMPLERS = [
    ({"top_k": 5}, "top_k", {"top_k": 5}),
    ({"top_p": 0.8}, "top_p", {"top_p": 0.8}),
    ({"min_p": 0.05}, "min_p", {"min_p": 0.05}),
    ({"typical_p": 0.5}, "typ_p", {"typical_p": 0.5}),
    ({"top_n_sigma": 1.5}, "top_n_sigma", {"top_n_sigma": 1.5}),
    ({"xtc_probability": 1.0, "xtc_threshold": 0.05}, "xtc", {"xtc_probability": 1.0, "xtc_threshold": 0.05}),
]
PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def completion(url: str, body: dict) -> dict:
    request = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["completion_probabilities"][0]


def kept_by_us(settings: RunSettings, logits: torch.Tensor, top: list[int]) -> set[int]:
    run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=True)
    processed = run_pipeline(build_pipeline(settings, sampling=True, run=run), torch.zeros(1, 1, dtype=torch.long),
                             logits[None])
    return {t for t in top if torch.isfinite(processed[0, t])}


def nudged(settings: RunSettings, ours: dict) -> list[RunSettings]:
    """The settings with each threshold 2 % lower and higher (top-k and XTC's probability stay)."""
    moved = {k: v for k, v in ours.items() if isinstance(v, float) and k != "xtc_probability"}
    return [settings.replace(**{k: v * f for k, v in moved.items()}) for f in (0.98, 1.02)] if moved else []


def tail_shifted(logits: torch.Tensor, top: list[int], delta: float) -> torch.Tensor:
    """The logits with every token outside ``top`` moved by ``delta``: llama-server's tail differs from ours (its
    Q4_1 products round the activations to 8 bits), which moves the entropy typical-p sorts by; a full run once saw
    typical keep one token more where a 0.2 shift of our tail moves the cut too."""
    shifted = logits + delta
    shifted[top] = logits[top]
    return shifted


def test_kept_sets_agree_with_llama_server(llama_server_url, default_lm):
    tokenizer, model = default_lm.tokenizer, default_lm.model
    compared = {name: 0 for _, name, _ in SAMPLERS}
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        for _ in range(3):  # three steps of the local greedy continuation
            with torch.inference_mode():
                logits = model(torch.tensor([ids])).logits[0, -1].float()
            top = torch.topk(logits, TOP).indices.tolist()
            raw = completion(llama_server_url, {"prompt": ids, "n_predict": 1, "n_probs": TOP, "samplers": [],
                                                "temperature": 1.0})
            theirs_raw = {t["id"]: float(torch.tensor(t["logprob"]).exp()) for t in raw["top_logprobs"]}
            ours_raw = logits.softmax(dim=-1)
            gap = max(abs(theirs_raw.get(t, 0.0) - float(ours_raw[t])) for t in top)
            if gap < RAW_GAP:
                # The same logits with llama-server's raw probabilities for the top tokens: a sampler whose cut
                # moves between the two is at a border the engines' rounding decides, and is not compared.
                theirs_logits = logits.clone()
                for t, p in theirs_raw.items():
                    theirs_logits[t] = torch.log(torch.tensor(p)) + torch.logsumexp(logits, dim=0)
                for ours, name, params in SAMPLERS:
                    settings = RunSettings(strategy="sample", **ours)
                    kept = kept_by_us(settings, logits, top)
                    # ... and so is one whose cut moves when its threshold moves by 2 %, or when the tail outside
                    # the top tokens moves a little (the engines' tails differ a little too).
                    variants = (logits, theirs_logits, *(tail_shifted(logits, top, d) for d in (-0.2, 0.2)))
                    if any(kept != kept_by_us(other, theirs, top) for theirs in variants
                           for other in (settings, *nudged(settings, ours))):
                        continue
                    post = completion(llama_server_url, {"prompt": ids, "n_predict": 1, "n_probs": 100,
                                                         "samplers": [name], "temperature": 1.0,
                                                         "post_sampling_probs": True, **params})
                    theirs = {t["id"] for t in post["top_probs"] if t["prob"] > 0} & set(top)
                    assert kept == theirs, (prompt, tokenizer.decode(ids[-3:]), name, sorted(kept), sorted(theirs))
                    compared[name] += 1
            ids = [*ids, int(logits.argmax())]
    # Most steps are compared (22 of 36 here), each sampler on at least two.
    assert sum(compared.values()) >= 0.55 * len(PROMPTS) * 3 * len(SAMPLERS) and min(compared.values()) >= 2, compared


def test_the_samplers_a_remote_run_forwards_take_effect_on_llama_server(llama_server_url, default_lm):
    """A remote run's logit bias (a ban) and top-nσ reach llama-server: the banned token never comes, and the
    post-sampler candidates it sends are the ones top-nσ keeps among them (computed here from its own raw ones)."""
    from playground.events.remote import RemoteTokenStep
    from playground.remote.decode import run_remote
    from playground.remote.source import RemoteSource

    def steps(settings: RunSettings, **source) -> list[RemoteTokenStep]:
        events = run_remote(RemoteSource(base_url=llama_server_url + "/v1", **source), settings)
        return [e for e in events if isinstance(e, RemoteTokenStep)]

    question = RunSettings(chat=False, prompt="The capital of France is", max_new_tokens=6, num_candidates=5)
    paris = default_lm.tokenizer.encode(" Paris", add_special_tokens=False)
    assert len(paris) == 1
    plain = steps(question)
    assert paris[0] in [s.token_id for s in plain], "precondition: the answer names Paris"
    banned = steps(question.replace(logit_bias=(f"{paris[0]}=-inf",)), post_sampling_probs=True)
    assert paris[0] not in [s.token_id for s in banned]
    assert all(paris[0] not in [c.token_id for c in s.candidates] for s in banned)  # after the chain: gone

    sigma = RunSettings(strategy="sample", chat=False, prompt="The capital of France is", max_new_tokens=1,
                        num_candidates=40, top_n_sigma=1.0, seed=1)
    raw = steps(sigma.replace(top_n_sigma=0.0, temperature=1.0))[0]
    post = steps(sigma, post_sampling_probs=True)[0]
    kept = {c.token_id for c in post.candidates if c.raw_prob > 0}
    assert 1 <= len(kept) < len({c.token_id for c in raw.candidates})  # top-nσ cut the candidates
