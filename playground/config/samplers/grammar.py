"""A constraint on what the model may say: a JSON schema, a regular expression, a grammar (Lark, or GBNF as
llama.cpp writes it) or a choice among strings, as one sampler of the chain that masks every token the constraint
forbids (llguidance's ``LLMatcher``, the library llama.cpp and vLLM use; ``playground.engine.samplers.grammar``).

The settings hold the constraint's text itself: a value that names a file (``--json-schema schema.json``,
``--grammar list.gbnf``) is read when the settings are made, so a saved run keeps the constraint, not a path.
``constraint_grammar`` turns the settings into llguidance's grammar; ``check_constraint`` refuses a bad one with
the library's own message (where it is) before a run starts. No torch here; llguidance is imported when a
constraint is on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playground.config.errors import ConfigError
from playground.config.groups import SettingsGroup, register_group
from playground.config.samplers.base import SamplerSpec, ServerWords, register_sampler
from playground.config.table import setting

GRAMMAR_SUFFIXES = (".lark", ".gbnf", ".ebnf", ".bnf", ".cfg", ".grammar")
SCHEMA_SUFFIXES = (".json",)


def _as_path(value: str) -> Path | None:
    """The file ``value`` may name: one line, not too long (else it is the constraint's text; a value that is not
    text names none, and the settings' check says it must be text)."""
    if not isinstance(value, str) or not value or "\n" in value or len(value) > 4096:
        return None
    return Path(value.strip()).expanduser()


def _read_if_file(value: str) -> str:
    """The text of the file ``value`` names, or ``value`` itself (the constraint's text, or a file that is not
    there: ``missing_file`` says so when the settings are checked, so the form can hold a path being typed)."""
    path = _as_path(value)
    try:
        return path.read_text(encoding="utf-8") if path is not None and path.is_file() else value
    except (OSError, UnicodeDecodeError):
        return value


def missing_file(value: str, suffixes: tuple[str, ...]) -> str:
    """The path ``value`` names when it looks like a file (it ends with one of ``suffixes``) that is not there."""
    path = _as_path(value)
    return value.strip() if path is not None and value.strip().lower().endswith(suffixes) else ""


def split_choices(entries: tuple[str, ...]) -> tuple[str, ...]:
    """``--choices yes,no --choices maybe`` -> ("yes", "no", "maybe"): each entry a comma list (``\\,`` for a
    comma inside a choice); blanks dropped, spaces inside a choice kept."""
    out: list[str] = []
    for entry in entries:
        for part in entry.replace("\\,", "\0").split(","):
            choice = part.replace("\0", ",")
            if choice.strip():
                out.append(choice)
    return tuple(out)


@register_group
@dataclass(frozen=True)
class GrammarSettings(SettingsGroup):
    name = "grammar"
    title = "Constraint (grammar)"

    json_schema: str = setting("", "JSON schema", "constrain the output to JSON that validates against this schema: "
                               "a file or the schema's text", flag="--json-schema")
    regex: str = setting("", "regular expression", "constrain the whole output to match this regular expression "
                         "(Rust regex syntax, as llguidance reads it)")
    grammar: str = setting("", "grammar", "constrain the output to this grammar: a file or its text, in Lark "
                           "(llguidance's syntax: 'start: ...') or GBNF as llama.cpp writes it ('root ::= ...')")
    choices: tuple[str, ...] = setting((), "choices", "the output must be exactly one of these strings (a comma "
                                       "list; \\, for a comma in one)")

    def __post_init__(self) -> None:
        # A file is read at once: the settings (and a saved run) hold the constraint itself.
        object.__setattr__(self, "json_schema", _read_if_file(self.json_schema))
        object.__setattr__(self, "grammar", _read_if_file(self.grammar))

    def given(self) -> list[str]:
        """The kinds of constraint these settings set."""
        return [kind for kind, on in (("json_schema", self.json_schema.strip()), ("regex", self.regex),
                                      ("grammar", self.grammar.strip()), ("choices", split_choices(self.choices)))
                if on]

    def active(self) -> bool:
        return bool(self.given())

    def cross_checks(self) -> list[tuple[bool, str]]:
        given = self.given()
        schema_file, grammar_file = missing_file(self.json_schema, SCHEMA_SUFFIXES), missing_file(
            self.grammar, GRAMMAR_SUFFIXES)
        return [(not schema_file, f"--json-schema: no file {schema_file}"),
                (not grammar_file, f"--grammar: no file {grammar_file}"),
                (len(given) <= 1, f"give one constraint, not {len(given)} ("
                 f"{', '.join('--' + k.replace('_', '-') for k in given)}): combine them in one grammar instead")]

    def validate(self) -> None:
        super().validate()
        if self.active():
            check_constraint(self)

    def summary(self) -> str:
        given = self.given()
        return f"{given[0]} constraint" if given else "no constraint"


def grammar_format(text: str) -> str:
    """"lark" or "gbnf": llguidance's own test (a ``start:`` rule or ``%llguidance`` is Lark; GBNF has ``root ::=``)."""
    from llguidance.gbnf_to_lark import is_lark_syntax

    return "lark" if is_lark_syntax(text) else "gbnf"


def constraint_grammar(settings: GrammarSettings) -> tuple[str, str]:
    """(kind, llguidance's grammar) for the one constraint the settings set; ``ConfigError`` for text that cannot
    even be read as its kind (JSON that does not parse, GBNF that cannot be converted)."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import gbnf_to_lark

    kind = settings.given()[0]
    if kind == "json_schema":
        try:
            schema = json.loads(settings.json_schema)
        except json.JSONDecodeError as error:
            raise ConfigError(f"--json-schema: not JSON: {error.msg} at line {error.lineno}, column {error.colno}"
                              ) from None
        if not isinstance(schema, (dict, bool)):
            raise ConfigError(f"--json-schema: a schema is a JSON object (got {type(schema).__name__})")
        return kind, LLMatcher.grammar_from_json_schema(json.dumps(schema))
    if kind == "regex":
        return kind, LLMatcher.grammar_from_regex(settings.regex)
    if kind == "choices":
        choices = split_choices(settings.choices)
        return kind, LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
    text = settings.grammar
    if grammar_format(text) == "gbnf":
        try:
            text = gbnf_to_lark(text)
        except Exception as error:  # the converter raises plain Exceptions for an unknown rule
            raise ConfigError(f"--grammar (GBNF): {error}") from None
    return kind, LLMatcher.grammar_from_lark(text)


def _regex_message(message: str) -> str:
    """The regex crate's own message (the pattern, a caret under the span, the error) without the place in the
    grammar llguidance wraps the pattern in (``at 1(8): ...`` and its ``1 | start: /.../`` snippet)."""
    lines = re.sub(r"^at \d+\(\d+\): ", "", message).split("\n")
    cut = next((i for i, line in enumerate(lines) if re.match(r"^\s*\d+ \| ", line)), len(lines))
    return "\n".join(lines[:cut]) if cut else message


def check_constraint(settings: GrammarSettings, tokenizer: Any = None) -> str:
    """The constraint's llguidance grammar, or ``ConfigError`` with the library's message (it says where:
    line and column, with a caret); ``tokenizer`` (an ``LLTokenizer``) checks it against a vocabulary too."""
    from llguidance import LLMatcher

    kind, grammar = constraint_grammar(settings)
    message = LLMatcher.validate_grammar(grammar, tokenizer)
    if message and kind == "regex":
        message = _regex_message(message)
    if message:
        flag = "--" + kind.replace("_", "-")
        raise ConfigError(f"{flag}: {message.rstrip()}")
    return grammar


register_sampler(SamplerSpec(
    name="grammar", position=65, aliases=("constraint",), group=GrammarSettings,
    reads=("json_schema", "regex", "grammar", "choices"), sampling_only=False, value_only=False, truncating=True,
    # After the penalties, DRY, logit bias and guidance, before every sampler that shapes the distribution: those see
    # only the tokens the constraint allows, as llama.cpp's grammar (applied first when its pick is refused) and
    # vLLM's bitmask (before its sampler). The earlier stages change single tokens' logits (guidance: all of them by
    # one shift besides), so the mask gives the same distribution before or after them; there it leaves
    # transformers' order of its processors as it is. The chain goes compact after it (few tokens allowed).
    help="constrain the output to a JSON schema, a regular expression, a grammar or a list of choices (--json-schema, "
         "--regex, --grammar, --choices)",
    is_on=lambda s: s.group(GrammarSettings).active(),
    needs_run="its matcher follows the chosen tokens",
    # Sent in each server's own fields, or refused by name there: playground.remote.constraint (a constraint is not
    # a chain entry or a sampler field: llama-server takes GBNF or a schema, vLLM its structured_outputs).
    server=ServerWords(),
    what_if="estimate: the what-if does not re-run the grammar (the run records how many tokens it allowed, not "
            "which)",
    what_if_examples=(dict(regex="[a-z ]+"),)))
