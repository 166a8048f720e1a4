"""What a remote run asks the server for: the route, the sampler settings in each engine's words, the logprobs.

Greedy is temperature 0 (both llama-server and vLLM then take the arg-max). Sampling passes the run's temperature,
top-k, top-p, min-p and seed. llama-server is also given the sampler order of a local run (penalties, temperature,
top-k, top-p, min-p: transformers' order; llama.cpp's own default applies temperature last and adds filters of its
own, top-k 40 and min-p 0.05, that the run did not ask for).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from playground.config import RunSettings
from playground.remote.client import EngineInfo
from playground.remote.errors import RemoteError
from playground.remote.source import RemoteSource

OPENAI_TOP_LOGPROBS_CAP = 20  # OpenAI's and vLLM's default cap (vLLM: --max-logprobs)
LLAMA_SAMPLERS = ["penalties", "temperature", "top_k", "top_p", "min_p"]


@dataclass(frozen=True)
class RemoteRequest:
    """One streamed request: the route and the keyword arguments of the ``openai`` client's ``create``."""

    endpoint: str  # "chat/completions" | "completions"
    kwargs: dict[str, Any] = field(default_factory=dict)
    top_logprobs: int = 0


def candidates_asked(settings: RunSettings, engine: str) -> int:
    """Candidates per token to ask for: the run's number; capped at 20 where servers refuse more by default."""
    return settings.num_candidates if engine == "llama.cpp" else min(settings.num_candidates,
                                                                   OPENAI_TOP_LOGPROBS_CAP)


def _sampler_extras(settings: RunSettings, info: EngineInfo, sampling: bool) -> dict[str, Any]:
    s = settings
    if info.engine == "llama.cpp":
        extra: dict[str, Any] = {"samplers": LLAMA_SAMPLERS, "top_k": s.top_k if sampling else 0,
                                 "min_p": s.min_p if sampling else 0.0, "repeat_penalty": s.repetition_penalty}
        if s.repetition_penalty != 1.0:
            extra["repeat_last_n"] = info.n_ctx or 8192  # the whole context, as transformers' penalty
        return extra
    extra = {}
    if sampling and s.top_k > 0:
        extra["top_k"] = s.top_k
    if sampling and s.min_p > 0:
        extra["min_p"] = s.min_p
    if s.repetition_penalty != 1.0:
        if info.engine != "vllm":
            raise RemoteError("repetition penalty: this server (a generic OpenAI-compatible one) has no such "
                              "setting; turn it off (1.0) or use a local model")
        extra["repetition_penalty"] = s.repetition_penalty
    return extra


def build_request(settings: RunSettings, info: EngineInfo, model: str, source: RemoteSource, *,
                  answer_start: str = "", max_tokens: int | None = None) -> RemoteRequest:
    """The request for ``settings`` on the server ``info`` describes; ``answer_start``: text the answer must
    continue (a branch), ``max_tokens``: the tokens left to generate (default: the run's maximum)."""
    s = settings
    sampling = s.strategy == "sample"
    k = candidates_asked(s, info.engine)
    kwargs: dict[str, Any] = {"model": model, "max_tokens": max_tokens or s.max_new_tokens, "stream": True,
                              "stream_options": {"include_usage": True}}
    if sampling:
        kwargs.update(temperature=s.temperature, top_p=s.top_p, seed=s.seed)
    else:
        kwargs["temperature"] = 0.0
    extra = _sampler_extras(s, info, sampling)
    if info.engine == "llama.cpp":
        extra["timings_per_token"] = True
        if source.post_sampling_probs:
            extra["post_sampling_probs"] = True
    elif source.post_sampling_probs:
        raise RemoteError(f"post-sampler probabilities are a llama-server option; this server is {info.engine} "
                          "(vLLM chooses its kind per server with --logprobs-mode)")
    if s.chat:
        messages = ([{"role": "system", "content": s.system}] if s.system.strip() else []) + \
                   [{"role": "user", "content": s.prompt}]
        if answer_start:
            # Continue the assistant's message: llama-server does so by itself when the last message is the
            # assistant's; vLLM needs to be told.
            messages.append({"role": "assistant", "content": answer_start})
            if info.engine == "vllm":
                extra.update(continue_final_message=True, add_generation_prompt=False)
        kwargs.update(messages=messages, logprobs=True, top_logprobs=k)
        endpoint = "chat/completions"
    else:
        kwargs.update(prompt=s.prompt + answer_start, logprobs=k)
        endpoint = "completions"
    if extra:
        kwargs["extra_body"] = extra
    return RemoteRequest(endpoint=endpoint, kwargs=kwargs, top_logprobs=k)


def distribution_of(info: EngineInfo, source: RemoteSource) -> tuple[str, str]:
    """(label, sentence): which distribution the server's numbers are, as far as the engine tells."""
    if info.engine == "llama.cpp":
        if source.post_sampling_probs:
            return ("post-sampler", "llama-server's probabilities after its sampler chain (penalties, temperature, "
                    "top-k/p, min-p): the distribution the token was drawn from; tokens the chain removed are not "
                    "listed")
        return ("raw", "llama-server's softmax of the model's logits, before any sampler (raw); the sampler's own "
                "distribution is not sent")
    if info.engine == "vllm":
        return ("raw (assumed)", "vLLM's default --logprobs-mode (raw_logprobs: before any sampler); a server "
                "started with processed_logprobs sends post-sampler numbers and does not say so")
    return ("unknown", "an OpenAI-compatible server that does not say which distribution its logprobs are")


def missing_of(info: EngineInfo, source: RemoteSource) -> tuple[str, ...]:
    """What this engine's stream does not give, for the views to say so."""
    missing = ["ranks (inferred from the candidates)", "the full vocabulary (top candidates only)",
               "the prompt's token ids", "KV cache bytes per token"]
    if info.engine == "llama.cpp":
        missing.append("raw probabilities" if source.post_sampling_probs else "post-sampler probabilities")
    else:
        missing += ["token ids", "per-token timings (arrival times instead)", "post-sampler probabilities"]
    if info.speculative:
        missing.append("probabilities of accepted draft tokens")
    return tuple(missing)
