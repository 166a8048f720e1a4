"""Events of a run streamed from a server (llama.cpp's ``llama-server``, vLLM, another OpenAI-compatible engine).

A remote run yields the shared events (``RunStarted``, ``PrefillDone``, ``RunFinished``), ``RemoteStarted`` right
after the start (which engine, which distribution the numbers are, what the engine does not tell), and one
``RemoteTokenStep`` per token. ``RemoteTokenStep`` *is* a ``TokenStep`` (the tokens view and the candidates chart
draw it unchanged) with three flags about how far its numbers can be trusted.

What a server's numbers are, next to a local run's:
- ``prob``, ``raw_prob`` and the candidates' ``raw_prob``/``processed_prob`` all hold the one number the server
  sent; ``RemoteStarted.distribution`` says which distribution it is (raw softmax, or after the sampler chain).
- Candidates are the server's top list (``top_logprobs``). Ranks are inferred from it (no engine streams ranks):
  a chosen token outside the list gets ``raw_rank = len(list) + 1`` and ``rank_exact=False`` ("> N").
- ``entropy`` (= ``processed_entropy``) sums −p·log2 p over the tokens the server named only: a lower bound on the
  entropy of the full distribution (the rest of the vocabulary adds its share, unknown here).
- ``token_id`` is the server's id where it sends one (llama-server); otherwise a negative number that only tells
  the candidates of one step apart (−1 for the most likely, −2 for the next, ...).
- ``kv_cache_bytes`` is 0: a server does not report it per token (``RunFinished.figures`` has its KV use).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from playground.events.run import TokenNumbers, TokenStep


@dataclass(frozen=True)
class RemoteStarted:
    """Second event of a remote run: the engine, and what its numbers are."""

    type: ClassVar[str] = "remote_start"
    engine: str  # "llama.cpp" | "vllm" | "generic"
    engine_version: str  # llama-server's build info, vLLM's version; "" when the server does not say
    base_url: str  # the API's URL (never holds credentials)
    model: str  # the server's model name
    endpoint: str  # "chat/completions" or "completions"
    distribution: str  # "raw" | "post-sampler" | "raw (assumed)" | "unknown"
    distribution_note: str  # one sentence for a tooltip: where the numbers come from
    top_logprobs: int  # candidates asked for per token
    timings: str  # "server": per-token times measured by the engine; "client": arrival times of the stream
    n_ctx: int  # the server's context size for a request (0 = not reported)
    speculative: bool  # the server drafts tokens: accepted draft tokens may come without probabilities
    api_key_env: str = ""  # NAME of the environment variable the key was read from ("" = no key); never the key
    model_meta: dict[str, Any] = field(default_factory=dict)  # llama-server: n_params, size, ftype, n_vocab, ...
    missing: tuple[str, ...] = ()  # what this engine does not give (ranks, the full vocabulary, token ids, ...)

    @property
    def token_numbers(self) -> TokenNumbers:  # one number per token: the distribution the server named
        return TokenNumbers(self.distribution, self.distribution_note)


@dataclass(frozen=True)
class RemoteTokenStep(TokenStep):
    """One token streamed from a server: a ``TokenStep`` whose numbers the server sent (see the module doc)."""

    type: ClassVar[str] = "remote_token"
    # False: the server sent no probabilities for this token (llama-server with speculative decoding reports
    # accepted draft tokens so). Its numbers are then placeholders (prob 0, logprob -inf, rank 0, no candidates):
    # draw it as "no probabilities from the server", never as certain or as unlikely.
    has_probs: bool = True
    # False: ``raw_rank`` is a lower bound (the chosen token is outside the list, or vLLM put it in a full list in
    # place of the last true candidate).
    rank_exact: bool = True
    # Bytes of this entry's text that belong to earlier tokens the server folded into it (llama-server sends the
    # byte pieces of one character as one entry, with the last piece's id and numbers): 0 = one token.
    merged_bytes: int = 0

    @property
    def two_distributions(self) -> bool:  # one number per token: the distribution the server named
        return False
