"""What a remote run asks the server for: the route, the sampler settings in each engine's words, the logprobs.

Greedy is temperature 0 (both llama-server and vLLM then take the arg-max). Sampling passes the run's temperature,
top-k, top-p, min-p and seed. llama-server is also given the run's sampler chain in its order (``samplers``;
transformers' order by default: penalties, temperature, top-k, top-p, min-p; llama.cpp's own default applies
temperature last and adds filters of its own, top-k 40 and min-p 0.05, that the run did not ask for) with every
sampler it has: typical-p, top-nσ, XTC, DRY, dynamic temperature, mirostat v2, presence and frequency penalties,
logit bias on token ids. Every server takes OpenAI's presence and frequency penalties and logit bias. A sampler the
server lacks is refused by name (``RemoteError``), never silently left out. A constraint (``--json-schema``, ...)
goes in each engine's own fields (``playground.remote.constraint``), or is refused by name (``ConfigError``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from playground.config import RunSettings
from playground.config.samplers import SPECS, parse_logit_bias, parse_sampler_order, sampler_is_on
from playground.remote.client import EngineInfo
from playground.remote.constraint import constraint_fields
from playground.remote.errors import RemoteError
from playground.remote.source import RemoteSource

OPENAI_TOP_LOGPROBS_CAP = 20  # OpenAI's and vLLM's default cap (vLLM: --max-logprobs)


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


# Each sampler's words come from its declaration (``SamplerSpec.server``): its llama-server chain word and fields,
# other servers' fields (or their refusal), OpenAI's own fields, or why no server, or only llama-server, has it.
# What is not one sampler's stays here: dynamic temperature is temperature's variant, an explicit order is
# llama-server's only, llama-server's always-sent neutral values, and the logit bias's token-id translation.
LLAMA_ONLY_EXTRA = {"dynatemp": "dynamic temperature", "samplers": "the sampler order"}
OPENAI_BIAS_LIMIT = 100.0  # OpenAI's logit_bias range: [-100, 100] (-100 bans)


def _refuse(what: str, why: str) -> RemoteError:
    return RemoteError(f"{what}: {why}; turn it off or use a local model")


def _logit_bias(settings: RunSettings, llama: bool) -> Any:
    """The run's logit bias as the server takes it: token ids only (a word is tokenized by our tokenizer, which a
    server run does not have, and llama-server's own words bias every token of the word, not its last)."""
    pairs: list[Any] = []
    for key, value in parse_logit_bias(settings.logit_bias):
        if not isinstance(key, int):
            raise _refuse(f"logit bias {key!r}", "a server takes token ids only; give the token's id")
        if llama:
            pairs.append([key, False if value == -math.inf else value])  # llama-server: false bans the token
        else:
            pairs.append((str(key), max(-OPENAI_BIAS_LIMIT, min(OPENAI_BIAS_LIMIT, value))))
    return pairs if llama else dict(pairs)


def _llama_chain(settings: RunSettings, sampling: bool) -> list[str]:
    """llama-server's ``samplers``: the run's order in its words; the four it always had stay (neutral when off)
    so a plain run asks what it always asked."""
    chain: list[str] = []
    for name in parse_sampler_order(settings.samplers):
        word = SPECS[name].server.llama_word
        neutral = word in ("penalties", "temperature", "top_k", "top_p", "min_p")
        if word is None or word in chain or not (neutral or sampler_is_on(settings, name)):
            continue
        if SPECS[name].sampling_only and not sampling and not neutral:
            continue
        chain.append(word)
    selecting = [w for w in chain if w in {s.server.llama_word for s in SPECS.values() if s.selecting}]
    chain = [w for w in chain if w not in selecting]
    for word in ("penalties", "temperature", "top_k", "top_p", "min_p"):  # left out of a user's order: off anyway
        if word not in chain:
            chain.append(word)
    return chain + selecting  # a selecting sampler last, as llama.cpp forces it


def _applied(settings: RunSettings, sampling: bool) -> list[str]:
    """The samplers the run applies, in its order (the sampling-only ones only when sampling)."""
    return [name for name in parse_sampler_order(settings.samplers)
            if sampler_is_on(settings, name) and (sampling or not SPECS[name].sampling_only)]


def _check_samplers(settings: RunSettings, info: EngineInfo, sampling: bool) -> None:
    s = settings
    on = [name for name in parse_sampler_order(s.samplers) if sampler_is_on(s, name)]
    applied = _applied(s, sampling)
    for name in applied:
        if SPECS[name].server.nowhere:
            raise _refuse(name.replace("_", " "), SPECS[name].server.nowhere)
    if info.engine == "llama.cpp":
        if sampling and s.mirostat == 2:
            others = [n for n in on if SPECS[n].sampling_only and n not in ("temperature", "mirostat")]
            if others:
                raise _refuse("mirostat", f"llama-server's mirostat replaces the rest of the chain, so "
                              f"{', '.join(others)} would be skipped there (the local engine applies them all)")
        return
    lacking = [SPECS[n].server.llama_only for n in applied if SPECS[n].server.llama_only]
    if sampling and s.dynatemp_range > 0:
        lacking.append(LLAMA_ONLY_EXTRA["dynatemp"])
    if s.samplers.strip():
        lacking.append(LLAMA_ONLY_EXTRA["samplers"])
    if lacking:
        raise _refuse(", ".join(lacking),
                      f"a llama-server option; this server is {info.engine}")


def _sampler_extras(settings: RunSettings, info: EngineInfo, sampling: bool) -> dict[str, Any]:
    s = settings
    _check_samplers(s, info, sampling)
    if info.engine == "llama.cpp":
        extra: dict[str, Any] = {"samplers": _llama_chain(s, sampling), "top_k": s.top_k if sampling else 0,
                                 "min_p": s.min_p if sampling else 0.0, "repeat_penalty": s.repetition_penalty}
        penalised = s.repetition_penalty != 1.0 or s.presence_penalty != 0.0 or s.frequency_penalty != 0.0
        if penalised:
            extra["repeat_last_n"] = info.n_ctx or 8192  # the whole context, as transformers' penalty
        if s.presence_penalty != 0.0 or s.frequency_penalty != 0.0:
            extra.update(presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty)
        if s.logit_bias:
            extra["logit_bias"] = _logit_bias(s, llama=True)
        for name in _applied(s, sampling):  # each sampler's own fields, from its declaration
            words = SPECS[name].server.llama
            if words is not None:
                extra.update(words(s, sampling))
        return extra
    extra = {}
    for name in _applied(s, sampling):  # other servers' fields for each sampler, from its declaration
        fields = SPECS[name].server.other
        if fields is not None:
            got = fields(s, info.engine, sampling)
            if isinstance(got, str):
                raise RemoteError(got)
            extra.update(got)
    return extra


def _openai_penalties(settings: RunSettings, info: EngineInfo) -> dict[str, Any]:
    """OpenAI's own sampler fields, which every compatible server takes (llama-server's go in its extras)."""
    if info.engine == "llama.cpp":
        return {}
    s = settings
    out: dict[str, Any] = {}
    for name in _applied(s, s.strategy == "sample"):
        words = SPECS[name].server.openai
        if words is not None:
            out.update(words(s))
    if s.logit_bias:
        out["logit_bias"] = _logit_bias(s, llama=False)
    return out


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
    extra.update(constraint_fields(s, info.engine, info.version))
    kwargs.update(_openai_penalties(s, info))
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
