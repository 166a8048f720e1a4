"""A constraint (``--json-schema``, ``--regex``, ``--grammar``, ``--choices``) sent to a server, and its reply checked.

``constraint_fields(settings, engine)``: the request fields in each engine's words, or ``ConfigError`` naming what
that server cannot take, before any request:

- llama-server (built here without LLGuidance, so GBNF only): a JSON schema as ``json_schema`` (it converts it to
  GBNF itself), a GBNF grammar as ``grammar``, choices and a plain regex turned into GBNF
  (``playground.remote.gbnf``); a Lark grammar is refused (llama-server reads Lark only with LLGuidance built in).
  Both routes (``/v1/completions``, ``/v1/chat/completions``) read these body fields.
- vLLM: ``structured_outputs`` with ``json``, ``regex``, ``choice`` or ``grammar`` (the grammar as written: its
  backends read GBNF/EBNF and Lark); a JSON schema on the chat route as OpenAI's ``response_format``, which every
  vLLM reads. Never the old ``guided_*`` fields: vLLM 0.12 removed them and ignores them without a word (HTTP 200,
  an unconstrained answer); a vLLM older than 0.10.2, which has no ``structured_outputs``, is refused.
- Any other server: refused (no shared field for a constraint in the OpenAI API's completions).

``check_reply(settings, text, complete)``: what is wrong with a constrained server's reply ("" when nothing). A
complete reply must be the whole of the constraint: a JSON schema's, ``json.loads`` and then JSON Schema's own rules
(``json_check``; llguidance's schema grammar where it meets a keyword that check does not read); a regex's,
``re.fullmatch`` where Python reads the pattern, else llguidance's; a choice's, membership; a grammar's, llguidance's
matcher fed the reply's bytes and accepting at the end. A reply cut short (the budget, a stop string, Stop) must be a
prefix of one (a schema's: a prefix of some JSON). The run says what it found (``RunFinished.stop_note``, figure
``constraint_valid``), never silently. No torch here.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from playground.config import ConfigError, RunSettings
from playground.config.samplers.grammar import GrammarSettings, constraint_grammar, grammar_format, split_choices
from playground.remote.gbnf import choices_gbnf, regex_gbnf

LLAMA = "llama.cpp"
VLLM = "vllm"
VLLM_STRUCTURED_OUTPUTS = (0, 10, 2)  # the first vLLM with structured_outputs (guided_* before; 0.12 removed those)


def constraint_of(settings: RunSettings) -> GrammarSettings | None:
    """The run's constraint settings, when one is on."""
    grammar = settings.group(GrammarSettings)
    return grammar if grammar.active() else None


def _schema(grammar: GrammarSettings) -> Any:
    try:
        return json.loads(grammar.json_schema)
    except json.JSONDecodeError as error:  # settings.validate() refuses it first; kept for a direct call
        raise ConfigError(f"--json-schema: not JSON: {error.msg}") from None


def _version(text: str) -> tuple[int, ...]:
    """"0.10.1.1" -> (0, 10, 1, 1); () when it is not a version."""
    parts = []
    for part in text.strip().lstrip("v").split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.end() < len(part):  # "0rc1", "2+cu128": the rest is no longer the version's numbers
            break
    return tuple(parts)


def constraint_fields(settings: RunSettings, engine: str, version: str = "") -> dict[str, Any]:
    """The request body fields that send the run's constraint to ``engine``'s server ({} when none is on);
    ``version``: the server's, where it says (an old vLLM lacks ``structured_outputs``)."""
    grammar = constraint_of(settings)
    if grammar is None:
        return {}
    kind = grammar.given()[0]
    if engine == LLAMA:
        if kind == "json_schema":
            return {"json_schema": _schema(grammar)}
        if kind == "regex":
            return {"grammar": regex_gbnf(grammar.regex)}
        if kind == "choices":
            return {"grammar": choices_gbnf(split_choices(grammar.choices))}
        if grammar_format(grammar.grammar) == "lark":
            raise ConfigError("--grammar: a Lark grammar cannot be sent to llama-server: it reads Lark only when "
                              "built with LLGuidance (this one is not; it answers 'llguidance is not enabled'). "
                              "Write it in GBNF ('root ::= ...'), or use a local model or vLLM")
        return {"grammar": grammar.grammar}
    if engine == VLLM:
        if kind == "json_schema" and settings.chat:  # OpenAI's own field: every vLLM reads it (into its json)
            return {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "constraint", "schema": _schema(grammar)}}}
        if _version(version) and _version(version) < VLLM_STRUCTURED_OUTPUTS:
            flag = "--" + kind.replace("_", "-")
            raise ConfigError(f"{flag}: this vLLM ({version}) predates structured_outputs (vLLM 0.10.2), and its "
                              "guided_* fields are gone from later ones, which ignore them without a word: the run "
                              "does not send those. Upgrade the server, or use a local model")
        words = {"json_schema": "json", "regex": "regex", "choices": "choice", "grammar": "grammar"}
        value: Any = {"json_schema": lambda: _schema(grammar), "regex": lambda: grammar.regex,
                      "choices": lambda: list(split_choices(grammar.choices)),
                      "grammar": lambda: grammar.grammar}[kind]()
        return {"structured_outputs": {words[kind]: value}}
    flag = "--" + kind.replace("_", "-")
    raise ConfigError(f"{flag}: this server ({engine}) has no known field for a constraint (the OpenAI API's "
                      "completions have none): llama-server and vLLM take one; or use a local model")


# -- checking the reply -------------------------------------------------------------------------------------------


class _ByteVocabulary:
    """A vocabulary of the 256 bytes (and an end token): llguidance's matcher fed a text byte by byte."""

    def __init__(self) -> None:
        self.eos_token_id = 256
        self.bos_token_id = None
        self.tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]
        self.special_token_ids = [256]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode("utf-8"))


@lru_cache(maxsize=1)
def _byte_tokenizer() -> Any:
    from llguidance import LLTokenizer, TokenizerWrapper

    return LLTokenizer(TokenizerWrapper(_ByteVocabulary()), slices=[])


def matcher_verdict(grammar_text: str, text: str, complete: bool) -> str:
    """llguidance's word on ``text`` under the grammar (llguidance's own, as ``constraint_grammar`` gives): "" when
    it is a sentence (``complete``) or a prefix of one, else what is wrong."""
    from llguidance import LLMatcher

    matcher = LLMatcher(_byte_tokenizer(), grammar_text, log_level=0)
    if matcher.is_error():
        return f"the constraint could not be read to check it: {matcher.get_error().splitlines()[0]}"
    data = text.encode("utf-8")
    for at, byte in enumerate(data):
        if not matcher.consume_token(byte):
            where = data[:at].decode("utf-8", errors="ignore")
            after = text[len(where):][:10]
            return f"it leaves the constraint after {len(where)} characters ({where[-30:]!r}, then {after!r})"
    if complete and not matcher.is_accepting():
        return "it ends before the constraint is complete"
    return ""


def check_reply(grammar: GrammarSettings, text: str, complete: bool) -> str:
    """What is wrong with the server's ``text`` under the constraint ("" when it conforms); ``complete``: the server
    ended the answer (else it was cut short: the text must only be a prefix of a conforming one)."""
    kind = grammar.given()[0]
    if kind == "json_schema":
        return _check_json(grammar, text, complete)
    if complete and kind == "choices":
        choices = split_choices(grammar.choices)
        return "" if text in choices else f"{text[:40]!r} is none of the {len(choices)} choices"
    if complete and kind == "regex":
        try:
            compiled = re.compile(grammar.regex)
        except re.error:
            compiled = None  # a pattern Python does not read (Rust syntax): llguidance's matcher decides
        if compiled is not None:
            return "" if compiled.fullmatch(text) else "it does not match the regular expression"
    _, grammar_text = constraint_grammar(grammar)
    return matcher_verdict(grammar_text, text, complete)


def _check_json(grammar: GrammarSettings, text: str, complete: bool) -> str:
    """A schema's reply: JSON (``json.loads``) that validates as JSON Schema reads it (``json_check``: keys in any
    order); a keyword that check does not read leaves it to llguidance's schema grammar (which fixes the keys'
    order). A reply cut short is checked as a prefix of some JSON only: llguidance's schema grammar would refuse a
    prefix whose keys come in another order than the schema's, which JSON Schema allows."""
    from llguidance import LLMatcher

    from playground.remote.json_check import Unchecked, problem

    if not complete:
        return matcher_verdict(LLMatcher.grammar_from_json_schema("{}"), text, complete=False)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return f"it is not JSON ({error.msg} at character {error.pos + 1})"
    try:
        return problem(value, json.loads(grammar.json_schema))
    except Unchecked:
        _, grammar_text = constraint_grammar(grammar)
        return matcher_verdict(grammar_text, text, complete=True)


def reply_note(settings: RunSettings, text: str, complete: bool) -> tuple[str, float | None]:
    """(the run's note on its constraint, the figure ``constraint_valid``: 1 conforms, 0 does not) for a server's
    reply; ("", None) when no constraint is on."""
    grammar = constraint_of(settings)
    if grammar is None:
        return "", None
    kind = grammar.given()[0].replace("_", " ")
    problem = check_reply(grammar, text, complete)
    if not problem:
        return "", 1.0
    whole = "reply" if complete else "reply so far (cut short)"
    fenced = _FENCE.fullmatch(text) if kind == "json schema" else None
    if fenced and not check_reply(grammar, fenced.group(1), complete):
        # llama-server's chat route lets the model write a Markdown fence around a schema's JSON (its chat parser
        # takes the fence out of the message's content, not out of the tokens): say that, not just "not JSON".
        return (f"the server's {whole} breaks the json schema constraint: the model wrote a Markdown code fence "
                "around the JSON, which the server allowed (llama-server's chat route does; its message content "
                "leaves the fence out, the tokens keep it). The JSON inside conforms"), 0.0
    return (f"the server's {whole} breaks the {kind} constraint: {problem}. The server may not have applied it "
            "(a field it ignores) or reads it differently"), 0.0


_FENCE = re.compile(r"\s*```[a-zA-Z]*\s*(.*?)\s*(?:```\s*)?", re.DOTALL)
