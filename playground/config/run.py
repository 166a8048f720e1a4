"""Settings shared by every strategy: the prompt, the sampler, the penalties; and the model to load.

Names mirror transformers' generation options so a setting reads the same in both places. Capability settings
(beam search, ...) live in their own groups (``playground.config.groups``) and ride along in ``groups``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from playground.config.errors import ConfigError
from playground.config.groups import GROUPS, RESERVED_FLAGS, G, SettingsGroup
from playground.config.table import check_all, from_plain, plain_value, rows, setting

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEFAULT_PROMPT = "What is the capital of France?"


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

    prompt: str = setting(DEFAULT_PROMPT, "prompt", "the prompt", form=False)
    chat: bool = setting(True, "chat", "wrap the prompt in the tokenizer's chat template (user turn + assistant "
                         "prompt)", section="generation")
    system: str = setting("", "system", "optional system message (chat only)", section="generation")
    strategy: str = setting("greedy", "strategy", "how the next token is chosen", cli=False, form=False)
    max_new_tokens: int = setting(64, "max new tokens", "most tokens to generate (forced ones included)",
                                  minimum=1, widget_maximum=100_000, section="generation")
    num_candidates: int = setting(10, "candidates", "top candidates recorded per step (by raw probability) for "
                                  "hover and chart", minimum=1, maximum=100, section="generation")
    stop_strings: tuple[str, ...] = setting((), "stop strings", r"stop when the output contains one of these "
                                            r"(separate with |, \n = newline)", flag="--stop", section="generation")
    temperature: float = setting(1.0, "temperature", "divide logits by this before sampling: <1 sharper, "
                                 ">1 flatter", minimum=0.0, above_minimum=True, widget_maximum=5.0, step=0.05,
                                 hint="for deterministic output use the greedy strategy", section="sampling")
    top_k: int = setting(0, "top-k", "keep only the k most likely tokens; 0 = off", minimum=0,
                         widget_maximum=100_000, off_text="off", hint="0 turns it off", section="sampling")
    top_p: float = setting(1.0, "top-p", "nucleus: keep the smallest set of tokens whose probability reaches p; "
                           "1 = off", minimum=0.0, above_minimum=True, maximum=1.0, step=0.05,
                           hint="1 turns it off", section="sampling")
    min_p: float = setting(0.0, "min-p", "drop tokens less likely than min-p × the top token's probability; "
                           "0 = off", minimum=0.0, maximum=0.99, step=0.01, hint="0 turns it off",
                           section="sampling")
    seed: int = setting(0, "seed", "seed of the sampler's random generator: same seed, same draws", minimum=0,
                        maximum=2**31 - 1, section="sampling")
    repetition_penalty: float = setting(1.0, "repetition penalty", "divide the logit of tokens already in the "
                                        "text; 1 = off", minimum=0.0, above_minimum=True, widget_maximum=5.0,
                                        step=0.05, hint="1 turns it off", section="penalties")
    no_repeat_ngram_size: int = setting(0, "no-repeat n-gram", "forbid repeating any n-gram of this size; 0 = off",
                                        minimum=0, widget_maximum=20, off_text="off", hint="0 turns it off",
                                        section="penalties")
    forced_token_ids: tuple[int, ...] = setting((), "forced tokens", "generated tokens to force first "
                                                "(branching)", cli=False, form=False)
    # Capability settings; a group left at its defaults is not stored (so equal settings compare equal).
    groups: tuple[SettingsGroup, ...] = ()

    def __post_init__(self) -> None:
        by_name: dict[str, SettingsGroup] = {}
        for group in self.groups:
            if not isinstance(group, SettingsGroup):
                raise TypeError(f"groups takes settings groups, not {group!r}")
            by_name[group.name] = group
        kept = tuple(by_name[name] for name in sorted(by_name) if by_name[name] != type(by_name[name])())
        object.__setattr__(self, "groups", kept)

    @classmethod
    def from_flat(cls, **values: Any) -> RunSettings:
        """Settings from one flat set of names, each capability's fields routed to its group
        (``RunSettings.from_flat(strategy="beam", num_beams=4)``): for tests, scripts and benchmarks."""
        groups = []
        for group in GROUPS.values():
            own = {f.name: values.pop(f.name) for f in dataclasses.fields(group) if f.name in values}
            if own:
                groups.append(group(**own))
        return cls(**values, groups=tuple(groups))

    def group(self, cls: type[G]) -> G:
        """This run's settings of one capability (its defaults if none were set)."""
        for group in self.groups:
            if isinstance(group, cls):
                return group
        return cls()

    def with_group(self, group: SettingsGroup) -> RunSettings:
        return dataclasses.replace(self, groups=(*self.groups, group))

    def validate(self) -> RunSettings:
        """Check every value (the strategy's name is checked by the engine's registry)."""
        check_all(self)
        checks = [
            (all(self.stop_strings), "stop strings must not be empty"),
            (bool(self.prompt.strip()) or bool(self.forced_token_ids), "the prompt is empty: write something"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        for group in self.groups:
            group.validate()
        return self

    def replace(self, **changes: Any) -> RunSettings:
        return dataclasses.replace(self, **changes)

    def as_plain_dict(self, include: tuple[type[SettingsGroup], ...] = ()) -> dict[str, Any]:
        """Settings as JSON values; each group under its name (``include``: groups to write even at defaults)."""
        plain = {row.name: plain_value(getattr(self, row.name)) for row in rows(RunSettings)}
        for cls in (*include, *(type(g) for g in self.groups)):
            plain[cls.name] = self.group(cls).as_plain_dict()
        return plain

    @classmethod
    def from_plain_dict(cls, plain: dict[str, Any]) -> tuple[RunSettings, list[str]]:
        """Settings from JSON values (a trace's ``start`` event, a preset), and the keys it did not know.

        Not validated: the caller decides (a saved run is shown whatever it says).
        """
        values, unknown = from_plain(cls, plain)
        values.pop("groups", None)
        groups = []
        for name in list(unknown):
            if name in GROUPS and isinstance(plain[name], dict):
                group, group_unknown = GROUPS[name].from_plain_dict(plain[name])
                groups.append(group)
                unknown.remove(name)
                unknown += [f"{name}.{key}" for key in group_unknown]
        return cls(**values, groups=tuple(groups)), unknown


RESERVED_FLAGS.update(row.flag for row in rows(RunSettings))
