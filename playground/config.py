"""Run settings as frozen dataclasses, validated with messages that say what to do.

Names mirror transformers' generation options so a setting reads the same in both places.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

STRATEGIES = ("greedy", "sample", "beam")
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")
EARLY_STOPPING = ("true", "false", "never")

DEFAULT_PROMPT = "What is the capital of France?"


class ConfigError(ValueError):
    """A setting that cannot work; the message says which and what to do."""


@dataclass(frozen=True)
class ModelSettings:
    path: str | None = None  # None: the default model (SmolLM2-135M-Instruct, fetched on demand)
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False  # runs code shipped in the model folder: off unless the user asks

    def validate(self) -> ModelSettings:
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {', '.join(DEVICES)}, not {self.device!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        return self


@dataclass(frozen=True)
class RunSettings:
    """Everything that decides one generation, apart from the model."""

    prompt: str = DEFAULT_PROMPT
    chat: bool = True  # apply the tokenizer's chat template to the prompt
    system: str = ""  # optional system message (chat only)
    strategy: str = "greedy"
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    min_p: float = 0.0  # 0.0 = off
    repetition_penalty: float = 1.0  # 1.0 = off
    no_repeat_ngram_size: int = 0  # 0 = off
    seed: int = 0
    stop_strings: tuple[str, ...] = ()
    num_candidates: int = 10  # top candidates recorded per step
    forced_token_ids: tuple[int, ...] = ()  # generated tokens to force first (branching)
    # Beam search
    num_beams: int = 4
    length_penalty: float = 1.0
    early_stopping: str = "false"
    num_return_sequences: int = 1
    extra: dict[str, Any] = field(default_factory=dict)  # strategy-specific settings added by later strategies

    def validate(self) -> RunSettings:
        checks = [
            (self.strategy in STRATEGIES, f"strategy must be one of {', '.join(STRATEGIES)}, not {self.strategy!r}"),
            (self.max_new_tokens >= 1, f"max_new_tokens must be at least 1 (got {self.max_new_tokens})"),
            (self.temperature > 0, f"temperature must be above 0 (got {self.temperature}); for "
             "deterministic output use the greedy strategy"),
            (self.top_k >= 0, f"top_k must be 0 (off) or a positive count (got {self.top_k})"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1] (got {self.top_p}); 1 turns it off"),
            (0 <= self.min_p < 1, f"min_p must be in [0, 1) (got {self.min_p}); 0 turns it off"),
            (self.repetition_penalty > 0,
             f"repetition_penalty must be above 0 (got {self.repetition_penalty}); 1 turns it off"),
            (self.no_repeat_ngram_size >= 0,
             f"no_repeat_ngram_size must be 0 (off) or positive (got {self.no_repeat_ngram_size})"),
            (1 <= self.num_candidates <= 100, f"num_candidates must be 1-100 (got {self.num_candidates})"),
            (self.seed >= 0, f"seed must be 0 or positive (got {self.seed})"),
            (1 <= self.num_beams <= 16, f"num_beams must be 1-16 (got {self.num_beams})"),
            (self.early_stopping in EARLY_STOPPING,
             f"early_stopping must be one of {', '.join(EARLY_STOPPING)} (got {self.early_stopping!r})"),
            (self.strategy != "beam" or 1 <= self.num_return_sequences <= self.num_beams,
             f"num_return_sequences must be between 1 and num_beams={self.num_beams} "
             f"(got {self.num_return_sequences})"),
            (all(self.stop_strings), "stop strings must not be empty"),
            (bool(self.prompt.strip()) or bool(self.forced_token_ids), "the prompt is empty: write something"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        return self

    def replace(self, **changes: Any) -> RunSettings:
        return dataclasses.replace(self, **changes)

    def as_plain_dict(self) -> dict[str, Any]:
        """Settings as JSON-friendly values (for events and the trace)."""
        plain = dataclasses.asdict(self)
        plain["stop_strings"] = list(self.stop_strings)
        plain["forced_token_ids"] = list(self.forced_token_ids)
        return plain
