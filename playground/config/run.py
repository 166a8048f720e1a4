"""Settings shared by every strategy: the prompt, the sampler, the penalties; and the model to load.

Names mirror transformers' generation options so a setting reads the same in both places. Capability settings
(beam search, ...) live in their own groups (``playground.config.groups``) and ride along in ``groups``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from playground.config.catalog import STRATEGIES
from playground.config.errors import ConfigError
from playground.config.groups import GROUPS, RESERVED_FLAGS, G, SettingsGroup
from playground.config.samplers import DEFAULT_ORDER, check_sampler_chain, parse_logit_bias
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
    record_candidates: int = setting(256, "recorded raw candidates", "the likeliest raw tokens saved per step (ids "
                                     "and log-probabilities, ~2 KB a step at 256) so that other sampler settings "
                                     "can be tried on the finished run (what-if); 0 = none", minimum=0,
                                     maximum=4096, section="generation")
    stop_strings: tuple[str, ...] = setting((), "stop strings", r"stop when the output contains one of these "
                                            r"(separate with |, \n = newline)", flag="--stop", section="generation")
    temperature: float = setting(1.0, "temperature", "divide logits by this before sampling: <1 sharper, "
                                 ">1 flatter", minimum=0.0, above_minimum=True, widget_maximum=5.0, step=0.05,
                                 hint="for deterministic output use the greedy strategy", section="sampling")
    top_k: int = setting(0, "top-k", "keep only the k most likely tokens; 0 = off; for contrastive-search: its k, "
                         "the candidates weighed each step (as transformers' top_k)", minimum=0,
                         widget_maximum=100_000, off_text="off", hint="0 turns it off", section="sampling")
    top_p: float = setting(1.0, "top-p", "nucleus: keep the smallest set of tokens whose probability reaches p; "
                           "1 = off", minimum=0.0, above_minimum=True, maximum=1.0, step=0.05,
                           hint="1 turns it off", section="sampling")
    min_p: float = setting(0.0, "min-p", "drop tokens less likely than min-p × the top token's probability; "
                           "0 = off", minimum=0.0, maximum=0.99, step=0.01, hint="0 turns it off",
                           section="sampling")
    typical_p: float = setting(1.0, "typical-p", "locally typical sampling: keep the tokens whose surprise is "
                               "closest to the entropy, up to this much probability; 1 = off", minimum=0.0,
                               above_minimum=True, maximum=1.0, step=0.05, hint="1 turns it off", section="sampling")
    epsilon_cutoff: float = setting(0.0, "epsilon cutoff", "drop tokens less likely than this probability "
                                    "(e.g. 0.0003); 0 = off", minimum=0.0, maximum=0.99, step=0.0001, decimals=4,
                                    hint="0 turns it off", section="sampling")
    eta_cutoff: float = setting(0.0, "eta cutoff", "drop tokens less likely than min(eta, √eta·e^-entropy) "
                                "(e.g. 0.0003); 0 = off", minimum=0.0, maximum=0.99, step=0.0001, decimals=4,
                                hint="0 turns it off", section="sampling")
    top_n_sigma: float = setting(0.0, "top-nσ", "keep tokens whose logit is within n standard deviations of the "
                                 "top logit; 0 = off", minimum=0.0, widget_maximum=10.0, step=0.1,
                                 hint="0 turns it off", section="sampling")
    xtc_probability: float = setting(0.0, "XTC probability", "exclude top choices: at each step, with this "
                                     "probability, remove every token at least as likely as the XTC threshold except "
                                     "the least likely of them; 0 = off", minimum=0.0, maximum=1.0, step=0.05,
                                     hint="0 turns it off", section="sampling")
    xtc_threshold: float = setting(0.1, "XTC threshold", "XTC removes tokens at least this likely (when two or "
                                   "more are)", minimum=0.0, above_minimum=True, maximum=0.5, step=0.01,
                                   hint="above 0.5 at most one token is that likely, and XTC never removes anything",
                                   section="sampling")
    dynatemp_range: float = setting(0.0, "dynamic temperature range", "entropy-based temperature in "
                                    "[temperature − range, temperature + range]: flat distributions get the high "
                                    "end; 0 = off", minimum=0.0, widget_maximum=5.0, step=0.05,
                                    hint="0 turns it off", section="sampling")
    dynatemp_exponent: float = setting(1.0, "dynamic temperature exponent", "the normalised entropy is raised to "
                                       "this power before it picks the temperature", minimum=0.0, above_minimum=True,
                                       widget_maximum=10.0, step=0.1, section="sampling")
    mirostat: int = setting(0, "mirostat", "2 = mirostat v2: drop tokens whose surprise exceeds mu and steer the "
                            "observed surprise to tau (mu is carried across steps); 0 = off", minimum=0, maximum=2,
                            off_text="off", hint="0 turns it off; 2 is mirostat v2 (v1 is not available)",
                            section="sampling")
    mirostat_tau: float = setting(5.0, "mirostat tau", "target surprise, in bits; mu starts at 2·tau",
                                  minimum=0.0, above_minimum=True, widget_maximum=20.0, step=0.5, section="sampling")
    mirostat_eta: float = setting(0.1, "mirostat eta", "learning rate of mu", minimum=0.0, above_minimum=True,
                                  maximum=1.0, step=0.01, section="sampling")
    samplers: str = setting("", "sampler order", "the order of the chain, as llama.cpp's --samplers: names "
                            "separated by ; (e.g. penalties;dry;top_k;typical_p;top_p;min_p;xtc;temperature); blank "
                            "= transformers' order: " + ";".join(DEFAULT_ORDER), section="sampling")
    seed: int = setting(0, "seed", "seed of the sampler's random generator: same seed, same draws", minimum=0,
                        maximum=2**31 - 1, section="sampling")
    repetition_penalty: float = setting(1.0, "repetition penalty", "divide the logit of tokens already in the "
                                        "text; 1 = off", minimum=0.0, above_minimum=True, widget_maximum=5.0,
                                        step=0.05, hint="1 turns it off", section="penalties")
    no_repeat_ngram_size: int = setting(0, "no-repeat n-gram", "forbid repeating any n-gram of this size; 0 = off",
                                        minimum=0, widget_maximum=20, off_text="off", hint="0 turns it off",
                                        section="penalties")
    presence_penalty: float = setting(0.0, "presence penalty", "subtract this from the logit of every token "
                                      "already in the text, prompt included (OpenAI's presence_penalty); 0 = off",
                                      minimum=-2.0, maximum=2.0, step=0.1, hint="0 turns it off",
                                      section="penalties")
    frequency_penalty: float = setting(0.0, "frequency penalty", "subtract this times the token's count in the "
                                       "text, prompt included (OpenAI's frequency_penalty); 0 = off", minimum=-2.0,
                                       maximum=2.0, step=0.1, hint="0 turns it off", section="penalties")
    dry_multiplier: float = setting(0.0, "DRY multiplier", "don't repeat yourself: a token that would extend a "
                                    "repeat of n ≥ allowed length tokens loses multiplier·base^(n − allowed length) "
                                    "from its logit; 0 = off", minimum=0.0, widget_maximum=5.0, step=0.05,
                                    hint="0 turns it off", section="penalties")
    dry_base: float = setting(1.75, "DRY base", "how fast the DRY penalty grows with the repeat's length",
                              minimum=1.0, widget_maximum=4.0, step=0.05, section="penalties")
    dry_allowed_length: int = setting(2, "DRY allowed length", "repeats up to this many tokens are not penalised",
                                      minimum=1, widget_maximum=20, section="penalties")
    dry_sequence_breakers: tuple[str, ...] = setting(("\n", ":", '"', "*"), "DRY sequence breakers",
                                                     r"a repeat never extends across these (\n = newline)",
                                                     section="penalties")
    logit_bias: tuple[str, ...] = setting((), "logit bias", "TOKEN=BIAS: add BIAS to a token id's or a word's "
                                          "logit, -inf bans it (e.g. ' Paris=-inf', '42=+5'); a word of several "
                                          "tokens biases its last token after the others", section="penalties")
    guidance_scale: float = setting(1.0, "guidance scale", "classifier-free guidance: scale·(log p(x | prompt) − "
                                    "log p(x | negative prompt)) + log p(x | negative prompt); 1 = off",
                                    minimum=0.0, above_minimum=True, widget_maximum=10.0, step=0.1,
                                    hint="1 turns it off", section="penalties")
    negative_prompt: str = setting("", "negative prompt", "what guidance steers away from (blank: the prompt's "
                                   "last token alone, as transformers does)", section="penalties")
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
            (self.mirostat != 1, "mirostat must be 0 (off) or 2 (mirostat v2); v1 is not available"),
            (all(self.dry_sequence_breakers), "DRY sequence breakers must not be empty"),
            (not self.negative_prompt.strip() or self.guidance_scale != 1.0,
             "the negative prompt needs a guidance scale other than 1 (1 turns guidance off)"),
        ]
        strategy = STRATEGIES.get(self.strategy)
        if strategy is not None and strategy.checks is not None:  # the strategy's own rules (its k, ...)
            checks += strategy.checks(self)
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        parse_logit_bias(self.logit_bias)
        check_sampler_chain(self)
        for group in self.groups:
            group.validate()
            for ok, message in group.settings_checks(self):
                if not ok:
                    raise ConfigError(message)
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
