"""Streamed chunks of an OpenAI-compatible server turned into token events: pure functions on plain JSON values.

Three shapes of per-token numbers arrive (the chunk's ``choices[0].logprobs``):
- chat style, ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}``: the chat route of
  every engine, and llama-server's plain completions too; llama-server adds ``"id"`` to each entry and candidate,
  and with ``post_sampling_probs`` writes ``"prob"``/``"top_probs"`` (probabilities after its sampler chain)
  instead of ``"logprob"``/``"top_logprobs"``;
- the legacy completions style, ``{"tokens": [...], "token_logprobs": [...], "top_logprobs": [{text: logprob}]}``
  (vLLM's and OpenAI's ``/v1/completions``);
- none at all: a server that ignores ``logprobs``, or llama-server's accepted draft tokens under speculative
  decoding (text but no numbers).
The meaning of the numbers is in ``playground.events.remote``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

from playground.events import Candidate
from playground.events.remote import RemoteTokenStep

NEG_INF = float("-inf")
LOGPROB_FLOOR = -9999.0  # vLLM writes -inf as -9999.0; llama.cpp writes log(0) as the lowest float


class MalformedChunk(ValueError):
    """A chunk whose shape is not an OpenAI-compatible stream's; the message says what is wrong."""


class MissingLogprobs(ValueError):
    """Tokens came without log-probabilities before any came with them: the server ignores ``logprobs``."""


@dataclass(frozen=True)
class StreamFormat:
    """How to read a stream: which engine sent it and how many candidates were asked for per token."""

    engine: str = "generic"  # "llama.cpp" | "vllm" | "generic"
    top_logprobs: int = 20


@dataclass
class ChunkParts:
    """What one chunk holds, whatever its route."""

    entries: list[dict[str, Any]] = field(default_factory=list)  # one per token, chat style
    text: str = ""  # the text the chunk adds (delta.content or text)
    finish_reason: str | None = None
    timings: dict[str, Any] | None = None  # llama-server's timings (cumulative over the request)
    usage: dict[str, Any] | None = None
    has_choice: bool = False  # False: a usage-only or empty chunk


def _legacy_entries(logprobs: dict[str, Any]) -> list[dict[str, Any]]:
    tokens = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or []
    if not isinstance(tokens, list) or not isinstance(values, list) or not isinstance(tops, list):
        raise MalformedChunk("logprobs.tokens, token_logprobs and top_logprobs must be lists")
    entries = []
    for i, token in enumerate(tokens):
        top = tops[i] if i < len(tops) and tops[i] is not None else {}
        if not isinstance(top, dict):
            raise MalformedChunk("each legacy top_logprobs item must map token text to its logprob")
        entries.append({"token": token, "logprob": values[i] if i < len(values) else None,
                        "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top.items()]})
    return entries


def chunk_parts(chunk: Any) -> ChunkParts:
    """The parts of one streamed chunk (a chat or completions chunk as plain JSON values)."""
    if not isinstance(chunk, dict):
        raise MalformedChunk(f"a chunk must be a JSON object, not {type(chunk).__name__}")
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        raise MalformedChunk("a chunk has no 'choices' list")
    timings = chunk.get("timings") if isinstance(chunk.get("timings"), dict) else None
    usage = chunk.get("usage") if isinstance(chunk.get("usage"), dict) else None
    if not choices:
        return ChunkParts(timings=timings, usage=usage)
    choice = choices[0]
    if not isinstance(choice, dict):
        raise MalformedChunk("a chunk's choice must be a JSON object")
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    if text is not None and not isinstance(text, str):
        raise MalformedChunk("a chunk's text must be a string")
    logprobs = choice.get("logprobs")
    entries: list[dict[str, Any]] = []
    if isinstance(logprobs, dict):
        content = logprobs.get("content")
        if isinstance(content, list):
            entries = content
        elif "tokens" in logprobs:
            entries = _legacy_entries(logprobs)
    elif logprobs is not None:
        raise MalformedChunk("a choice's logprobs must be an object or null")
    if any(not isinstance(e, dict) for e in entries):
        raise MalformedChunk("each logprobs entry must be a JSON object")
    finish = choice.get("finish_reason")
    return ChunkParts(entries=entries, text=text or "", finish_reason=finish if isinstance(finish, str) else None,
                      timings=timings, usage=usage, has_choice=True)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise MalformedChunk(f"{what} must be a number (got {value!r})")
    return float(value)


def prob_and_logprob(item: dict[str, Any]) -> tuple[float, float]:
    """(p, ln p) of an entry or candidate: from ``prob`` (llama-server's post-sampler numbers) or ``logprob``."""
    if "prob" in item:
        p = _number(item["prob"], "prob")
        if not 0.0 <= p <= 1.0 + 1e-6:
            raise MalformedChunk(f"prob must be in [0, 1] (got {p})")
        p = min(p, 1.0)
        return p, (math.log(p) if p > 0 else NEG_INF)
    logprob = _number(item.get("logprob"), "logprob")
    if logprob > 1e-6:
        raise MalformedChunk(f"logprob must be at most 0 (got {logprob})")
    if logprob <= LOGPROB_FLOOR:
        return 0.0, NEG_INF
    logprob = min(logprob, 0.0)
    return math.exp(logprob), logprob


def piece_text(item: dict[str, Any]) -> str:
    """A candidate's own text: its ``bytes`` decoded, or ``<0xE9>`` pieces when they are part of a character (as a
    local run shows byte tokens), else its ``token`` string."""
    raw = item.get("bytes")
    if isinstance(raw, list) and raw and all(isinstance(b, int) and 0 <= b < 256 for b in raw):
        data = bytes(raw)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "".join(f"<0x{b:02X}>" for b in data)
    token = item.get("token")
    if not isinstance(token, str):
        raise MalformedChunk(f"a token must be a string (got {token!r})")
    return token


def _raw_bytes(item: dict[str, Any]) -> bytes | None:
    raw = item.get("bytes")
    if isinstance(raw, list) and all(isinstance(b, int) and 0 <= b < 256 for b in raw):
        return bytes(raw)
    return None


def _server_id(item: dict[str, Any]) -> int | None:
    value = item.get("id")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def no_probs_step(step: int, text: str, *, token_id: int = -1, step_ms: float = 0.0,
                  forced: bool = False) -> RemoteTokenStep:
    """A token the server sent without probabilities: placeholders, flagged ``has_probs=False``."""
    return RemoteTokenStep(
        step=step, token_id=token_id, text=text, prob=0.0, raw_prob=0.0, logprob=NEG_INF, raw_rank=0,
        entropy=0.0, processed_entropy=0.0, candidates=(), shown_raw_mass=0.0, effects=(), forced=forced,
        step_ms=step_ms, kv_cache_bytes=0, has_probs=False, rank_exact=False,
    )


def entry_step(entry: dict[str, Any], step: int, fmt: StreamFormat, *, step_ms: float = 0.0,
               forced: bool = False) -> RemoteTokenStep:
    """The token event of one logprobs entry (chat style): candidates sorted by probability, the chosen token's
    rank inferred from them, entropy over the named tokens."""
    text = entry.get("token")
    if not isinstance(text, str):
        raise MalformedChunk(f"a token must be a string (got {text!r})")
    p, logprob = prob_and_logprob(entry)
    tops = entry.get("top_probs", entry.get("top_logprobs")) or []
    if not isinstance(tops, list) or any(not isinstance(t, dict) for t in tops):
        raise MalformedChunk("top_logprobs must be a list of objects")
    chosen_id = _server_id(entry)
    if not tops and fmt.top_logprobs > 0 and p == 1.0:
        # llama-server's accepted draft tokens: "prob 1.0" is a placeholder, not a measurement.
        return no_probs_step(step, text, token_id=-1 if chosen_id is None else chosen_id, step_ms=step_ms,
                             forced=forced)

    numbers = [prob_and_logprob(t) for t in tops]
    order = sorted(range(len(tops)), key=lambda i: -numbers[i][0])  # stable: ties keep the server's order
    ids = [_server_id(tops[i]) for i in order]
    synthetic = any(i is None for i in ids)
    cand_ids = [-(k + 1) if synthetic else cast(int, ids[k]) for k in range(len(order))]  # all set: ints

    # Which listed candidate is the chosen token: by id where the server sends ids, else by text and number.
    chosen_k: int | None = None
    if chosen_id is not None and not synthetic:
        chosen_k = next((k for k, i in enumerate(cand_ids) if i == chosen_id), None)
    else:
        same_text = [k for k, i in enumerate(order) if tops[i].get("token") == text]
        exact = [k for k in same_text if numbers[order[k]][1] == logprob]
        chosen_k = next(iter(exact or same_text), None)

    candidates = [
        Candidate(token_id=cand_ids[k], text=piece_text(tops[i]), raw_prob=numbers[i][0],
                  processed_prob=numbers[i][0], raw_rank=k + 1)
        for k, i in enumerate(order)
    ]
    shown_mass = sum(c.raw_prob for c in candidates)
    merged = 0
    if chosen_k is None:
        token_id = chosen_id if chosen_id is not None else -(len(order) + 1)
        rank, rank_exact = len(order) + 1, False  # "> N": outside the server's list
        candidates.append(Candidate(token_id=token_id, text=piece_text(entry), raw_prob=p, processed_prob=p,
                                    raw_rank=rank))
    else:
        token_id = cand_ids[chosen_k]
        rank = 1 + sum(1 for c in candidates if c.raw_prob > p)
        # vLLM puts the sampled token first in its list even when it is not in the top N, pushing out the last
        # true candidate: a chosen token at the bottom of a full list may rank lower than it seems.
        rank_exact = bool(tops) and not (fmt.engine != "llama.cpp" and rank >= len(order)
                                         and len(order) >= fmt.top_logprobs)
        own, whole = _raw_bytes(tops[order[chosen_k]]), _raw_bytes(entry)
        if own and whole and whole != own and whole.endswith(own):
            merged = len(whole) - len(own)
    if not tops:
        rank, rank_exact = 1, False  # a probability but no list to rank it in
    entropy = sum(-c.raw_prob * math.log2(c.raw_prob) for c in candidates if c.raw_prob > 0)
    return RemoteTokenStep(
        step=step, token_id=token_id, text=text, prob=p, raw_prob=p, logprob=logprob, raw_rank=rank,
        entropy=entropy, processed_entropy=entropy, candidates=tuple(candidates), shown_raw_mass=shown_mass,
        effects=(), forced=forced, step_ms=step_ms, kv_cache_bytes=0, has_probs=True, rank_exact=rank_exact,
        merged_bytes=merged,
    )


def chunk_steps(parts: ChunkParts, fmt: StreamFormat, first_step: int, chunk_ms: float,
                had_probs: bool) -> list[RemoteTokenStep]:
    """The token events of one chunk. ``chunk_ms``: the chunk's time, split evenly over its tokens (vLLM may send
    several in one chunk); ``had_probs``: earlier tokens of the run came with probabilities.

    Text without numbers after tokens with numbers is llama-server's accepted draft tokens (speculative decoding):
    a step flagged ``has_probs=False``. Text without numbers from the start is a server that ignores ``logprobs``
    (``MissingLogprobs``)."""
    if parts.entries:
        share = chunk_ms / len(parts.entries)
        return [entry_step(e, first_step + i, fmt, step_ms=share) for i, e in enumerate(parts.entries)]
    if not parts.text:
        return []
    if not had_probs:
        raise MissingLogprobs("tokens came without log-probabilities")
    return [no_probs_step(first_step, parts.text, step_ms=chunk_ms)]
