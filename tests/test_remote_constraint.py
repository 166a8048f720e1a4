"""A constraint sent to a server: the request fields per engine (hand-written payloads), the refusals by name, the
regex -> GBNF translation held to Python's ``re.fullmatch``, and the reply checked after the run (a fake vLLM that
answers a set text: a reply that breaks the constraint says so in the run, one that keeps it says nothing)."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from llguidance import LLMatcher
from llguidance.gbnf_to_lark import gbnf_to_lark

from playground.config import ConfigError, RunSettings
from playground.config.samplers.grammar import GrammarSettings
from playground.events import Candidate, RunFinished
from playground.remote.branch import RemoteBranch
from playground.remote.client import EngineInfo
from playground.remote.constraint import check_reply, matcher_verdict
from playground.remote.decode import run_remote
from playground.remote.gbnf import choices_gbnf, regex_gbnf
from playground.remote.request import build_request
from playground.remote.source import RemoteSource

LLAMA = EngineInfo(engine="llama.cpp", version="b1", models=("m",), n_ctx=4096)
VLLM = EngineInfo(engine="vllm", version="0.12.0", models=("m",))
GENERIC = EngineInfo(engine="generic", version="", models=("m",))
SOURCE = RemoteSource(base_url="http://h:1/v1")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
GBNF = 'root ::= "yes" | "no"\n'
LARK = 'start: "yes" | "no"\n'


def constrained(chat: bool = False, **constraint: Any) -> RunSettings:
    return RunSettings(chat=chat, prompt="Answer:", num_candidates=5).with_group(GrammarSettings(**constraint))


def extra_body(settings: RunSettings, info: EngineInfo) -> dict[str, Any]:
    return build_request(settings, info, "m", SOURCE).kwargs.get("extra_body", {})


PLAIN_LLAMA = extra_body(RunSettings(chat=False, prompt="Answer:", num_candidates=5), LLAMA)


@pytest.mark.parametrize("chat", [False, True])
def test_llama_server_payloads(chat):
    # Each kind in llama-server's words, on both routes: the plain request's fields plus exactly these.
    plain = extra_body(RunSettings(chat=chat, prompt="Answer:", num_candidates=5), LLAMA)
    cases = [
        (dict(json_schema=json.dumps(SCHEMA)), {"json_schema": SCHEMA}),
        (dict(grammar=GBNF), {"grammar": GBNF}),
        (dict(choices=("yes", 'say "hi"', "a\\, b")), {"grammar": 'root ::= "yes" | "say \\x22hi\\x22" | '
                                                             '"a\\x2C b"\n'}),
        (dict(regex=r"[0-9]{4}-\d\d"), {"grammar": "root ::= [0-9]{4} \"\\x2D\" [0-9] [0-9]\n"}),
    ]
    for constraint, fields in cases:
        assert extra_body(constrained(chat, **constraint), LLAMA) == {**plain, **fields}, constraint


@pytest.mark.parametrize("chat", [False, True])
def test_vllm_payloads_use_structured_outputs_never_guided(chat):
    cases = [
        (dict(json_schema=json.dumps(SCHEMA)), {"json": SCHEMA}),
        (dict(regex=r"[0-9]{4}-\d\d"), {"regex": r"[0-9]{4}-\d\d"}),
        (dict(choices=("yes", "no", "a\\, b")), {"choice": ["yes", "no", "a, b"]}),
        (dict(grammar=GBNF), {"grammar": GBNF}),
        (dict(grammar=LARK), {"grammar": LARK}),  # vLLM's backends read Lark too
    ]
    for constraint, words in cases:
        for info in (VLLM, EngineInfo("vllm", "", ("m",)), EngineInfo("vllm", "0.10.2+cu128", ("m",)),
                     EngineInfo("vllm", "0.11.0rc1", ("m",))):
            request = build_request(constrained(chat, **constraint), info, "m", SOURCE)
            if chat and "json_schema" in constraint:  # OpenAI's own field on the chat route
                expected = {"response_format": {"type": "json_schema",
                                                "json_schema": {"name": "constraint", "schema": SCHEMA}}}
            else:
                expected = {"structured_outputs": words}
            assert request.kwargs["extra_body"] == expected, (constraint, info.version)
            assert "guided" not in json.dumps(request.kwargs), constraint  # removed in vLLM 0.12: silently ignored
        if not (chat and "json_schema" in constraint):  # an old vLLM lacks structured_outputs: refused
            for old in ("0.10.1.1", "0.10.1rc2.dev3", "0.9.2"):
                with pytest.raises(ConfigError, match=rf"this vLLM \({old}\) predates structured_outputs"):
                    build_request(constrained(chat, **constraint), EngineInfo("vllm", old, ("m",)), "m", SOURCE)


def test_no_constraint_sends_nothing():
    # The constraint's group there but empty: the request is the plain one.
    assert extra_body(constrained(), LLAMA) == PLAIN_LLAMA
    assert not {"grammar", "json_schema"} & set(PLAIN_LLAMA)
    assert "extra_body" not in build_request(constrained(), VLLM, "m", SOURCE).kwargs
    assert "extra_body" not in build_request(RunSettings(chat=False, prompt="Answer:"), VLLM, "m", SOURCE).kwargs


def test_what_a_server_cannot_take_is_refused_by_name():
    with pytest.raises(ConfigError, match="Lark grammar cannot be sent to llama-server"):
        build_request(constrained(grammar=LARK), LLAMA, "m", SOURCE)
    for constraint, flag in ((dict(json_schema=json.dumps(SCHEMA)), "--json-schema"), (dict(regex="a+"), "--regex"),
                             (dict(grammar=GBNF), "--grammar"), (dict(choices=("a", "b")), "--choices")):
        with pytest.raises(ConfigError, match=f"{flag}: this server \\(generic\\) has no known field"):
            build_request(constrained(**constraint), GENERIC, "m", SOURCE)
    refused = {r"(?=a)b": "look-around", r"\bword": "word boundary", r"(a)\1": "escape \\\\1",
               r"[[:alpha:]]": "POSIX class", r"a*+": "quantifier after a quantifier", r"\p{L}+": "Unicode class",
               r"a^b": "anchor", r"[]a]": "starts with ']'", r"[\d-z]": "range with a class"}
    for pattern, what in refused.items():
        with pytest.raises(ConfigError, match=f"--regex: .*{what}"):
            build_request(constrained(regex=pattern), LLAMA, "m", SOURCE)
        build_request(constrained(regex=pattern), VLLM, "m", SOURCE)  # vLLM takes the regex as written


def test_a_remote_branch_under_a_constraint_is_refused():
    # Refused before the branch is even looked at (or any request made).
    branch = RemoteBranch(steps=(), step=0, alternative=Candidate(token_id=1, text="n", raw_prob=0.5,
                                                                   processed_prob=0.5, raw_rank=2))
    with pytest.raises(ConfigError, match="remote branch under a constraint"):
        run_remote(SOURCE, constrained(grammar=GBNF), branch=branch)


# -- regex -> GBNF, held to Python's re.fullmatch (an independent reader) ------------------------------------------

PATTERNS = [r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"\d{1,3}(\.\d+)?", r"(yes|no|maybe)", r"^[A-Z][a-z]*( [A-Z][a-z]*)*$",
            r"a.c", r"[^a-c]+", r"[-a]x", r"[a-]x", r"\w+@\w+\.com", r"(ab)*c?", r"x{2,}", r"x{0,2}y",
            r"(?:\$|€)\d+", r"[\]\\]", r"\(\)", r"a|", r"\s*\S+", r'"[^"]*"', r"[.*+?]{2}", r"x+?y", r"\x41\t?"]
TEXTS = ["", "a", "b", "c", "x", "y", "0", "9", "-", ".", "A", "z", " ", "yes", "no", "maybe", "2024-01-02", "12",
         "1.5", "Ab Cd", "Ab cd", "abc", "a\nc", "-x", "ax", "bx", "foo@bar.com", "ababc", "xx", "xxx", "xxy", "y",
         "$12", "€3", "]", "\\", "()", " q", '"hi"', '"h"i"', ".*", "*+", "xy", "xxxy", "ac", "a c", "a€c", "d",
         "A\t", "AA", "1.", "yess", "2024-1-02"]


def gbnf_accepts(gbnf: str, text: str) -> bool:
    """llguidance's matcher (over bytes) reading the GBNF as llama.cpp writes it: whether ``text`` is a sentence."""
    return not matcher_verdict(LLMatcher.grammar_from_lark(gbnf_to_lark(gbnf)), text, complete=True)


def test_regex_gbnf_accepts_exactly_what_python_full_matches():
    mismatches = [(p, t) for p in PATTERNS for t in TEXTS
                  if gbnf_accepts(regex_gbnf(p), t) != (re.fullmatch(p, t) is not None)]
    assert mismatches == []
    accepted = sum(re.fullmatch(p, t) is not None for p in PATTERNS for t in TEXTS)
    assert accepted >= 40  # the sample is not all refusals


def test_choices_gbnf_is_exactly_the_choices():
    choices = ("yes", 'say "hi"', "a\\b", "1,2", "naïve", "x-y\n", " [x]")
    gbnf = choices_gbnf(choices)
    assert all(gbnf_accepts(gbnf, c) for c in choices)
    assert not any(gbnf_accepts(gbnf, t) for t in ("ye", "yes ", "say hi", "ab", "x-y", "[x]", "no"))


# -- the reply checked ------------------------------------------------------------------------------------------


def test_check_reply_per_kind():
    schema = GrammarSettings(json_schema=json.dumps(SCHEMA))
    assert check_reply(schema, '{"name": "Ann", "age": 3}', complete=True) == ""
    assert check_reply(schema, '{\n  "name" : "Ann",\n  "age": 3\n}', complete=True) == ""
    assert "not JSON" in check_reply(schema, '{"name": "Ann", "age": 3', complete=True)
    assert check_reply(schema, '{"name": "Ann", "age": 3', complete=False) == ""  # cut short: a prefix
    assert "$.age: \"3\" is not of type integer" in check_reply(schema, '{"name": "Ann", "age": "3"}', complete=True)
    assert "required key 'name' is missing" in check_reply(schema, '{"age": 3}', complete=True)
    # Keys in any order and extra keys are JSON Schema's (llguidance's grammar fixes the order: not the check).
    assert check_reply(schema, '{"age": 3, "name": "Ann", "x": [1]}', complete=True) == ""
    assert "leaves the constraint" in check_reply(schema, 'Sure, {"name"', complete=False)
    regex = GrammarSettings(regex=r"[0-9]{4}-[0-9]{2}")
    assert check_reply(regex, "2024-01", complete=True) == ""
    assert "does not match" in check_reply(regex, "2024-011", complete=True)
    assert check_reply(regex, "2024-0", complete=False) == ""
    assert "leaves the constraint" in check_reply(regex, "2024x", complete=False)
    choices = GrammarSettings(choices=("yes", "no"))
    assert check_reply(choices, "no", complete=True) == ""
    assert "none of the 2 choices" in check_reply(choices, "nope", complete=True)
    assert check_reply(choices, "ye", complete=False) == ""
    for text in (GBNF, LARK):
        grammar = GrammarSettings(grammar=text)
        assert check_reply(grammar, "yes", complete=True) == ""
        assert "ends before" in check_reply(grammar, "ye", complete=True)
        assert "leaves the constraint after 2 characters" in check_reply(grammar, "yex", complete=True)


def test_json_schema_rules():
    tree = {"$defs": {"leaf": {"type": "string", "minLength": 1}},
            "type": "object", "additionalProperties": False, "required": ["kind"],
            "properties": {"kind": {"enum": ["a", "b"]}, "tags": {"type": "array", "items": {"$ref": "#/$defs/leaf"},
                                                                  "maxItems": 2, "uniqueItems": True},
                           "n": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
                           "pair": {"prefixItems": [{"type": "number"}, {"const": "x"}]}}}
    cases = {
        '{"kind": "a"}': "",
        '{"n": null, "kind": "b", "tags": ["p", "q"], "pair": [1.5, "x"]}': "",
        '{"n": 2.0, "kind": "a"}': "",  # 2.0 is an integer to JSON Schema
        '{"kind": "c"}': "$.kind: \"c\" is none of the enum's values",
        '{"kind": "a", "other": 1}': "$: the key 'other' is not allowed (additionalProperties: false)",
        '{"kind": "a", "tags": [""]}': "$.tags[0]: a string of 0 characters is outside minLength/maxLength",
        '{"kind": "a", "tags": ["p", "p"]}': "$.tags: its items are not unique",
        '{"kind": "a", "tags": ["p", "q", "r"]}': "$.tags: an array of 3 items is outside minItems/maxItems",
        '{"kind": "a", "n": -1}': "$.n: matches none of anyOf ($.n: -1 breaks minimum 0)",
        '{"kind": "a", "n": true}': "$.n: matches none of anyOf ($.n: true is not of type integer)",
        '{"kind": "a", "pair": [1, "y"]}': '$.pair[1]: "y" is not the const "x"',
    }
    grammar = GrammarSettings(json_schema=json.dumps(tree))
    assert {text: check_reply(grammar, text, complete=True) for text in cases} == cases
    # A keyword the check does not read: llguidance's schema grammar decides.
    odd = GrammarSettings(json_schema=json.dumps({"type": "object", "minProperties": 1, "required": ["a"],
                                                  "properties": {"a": {"type": "integer"}}}))
    assert check_reply(odd, '{"a": 1}', complete=True) == ""
    assert check_reply(odd, '{"a": "1"}', complete=True) != ""


class FakeVllm(BaseHTTPRequestHandler):
    """Answers as vLLM does (its /v1/models says so), streaming ``reply`` token by token; keeps the bodies sent."""

    reply: ClassVar[list[str]] = []
    bodies: ClassVar[list[dict]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, body: bytes, kind: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(json.dumps({"data": [{"id": "m", "owned_by": "vllm", "max_model_len": 2048}]}).encode())
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        chunks = []
        for i, text in enumerate(self.reply):
            entry = {"token": text, "logprob": -0.5, "bytes": list(text.encode()),
                     "top_logprobs": [{"token": text, "logprob": -0.5}]}
            choice = {"index": 0, "delta": {"content": text}, "logprobs": {"content": [entry]},
                      "finish_reason": "stop" if i == len(self.reply) - 1 else None}
            chunks.append(b"data: " + json.dumps({"object": "chat.completion.chunk", "choices": [choice]}).encode())
        self._send(b"\n\n".join([*chunks, b"data: [DONE]"]) + b"\n\n", "text/event-stream")


@pytest.fixture
def fake_vllm():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeVllm.bodies.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def finished(url: str, settings: RunSettings, reply: list[str]) -> RunFinished:
    FakeVllm.reply = reply
    done = list(run_remote(RemoteSource(base_url=url), settings))[-1]
    assert isinstance(done, RunFinished)
    return done


def test_a_reply_that_breaks_the_constraint_says_so(fake_vllm):
    settings = constrained(chat=True, json_schema=json.dumps(SCHEMA))
    done = finished(fake_vllm, settings, ['{"name"', ': "Ann"', "}"])  # "age" missing: a server that ignored it
    assert FakeVllm.bodies[-1]["response_format"]["json_schema"]["schema"] == SCHEMA
    assert done.stop_reason == "eos" and done.figures["constraint_valid"] == 0.0
    assert "breaks the json schema constraint" in done.stop_note and "'age' is missing" in done.stop_note
    done = finished(fake_vllm, settings, ["Sure", ", here"])
    assert "not JSON" in done.stop_note and done.figures["constraint_valid"] == 0.0
    done = finished(fake_vllm, constrained(chat=True, choices=("yes", "no")), ["ye", "s!"])
    assert FakeVllm.bodies[-1]["structured_outputs"] == {"choice": ["yes", "no"]}
    assert "none of the 2 choices" in done.stop_note


def test_a_reply_that_keeps_the_constraint_says_nothing(fake_vllm):
    done = finished(fake_vllm, constrained(chat=True, json_schema=json.dumps(SCHEMA)),
                    ['{"name"', ': "Ann"', ', "age": 4}'])
    assert done.stop_note == "" and done.figures["constraint_valid"] == 1.0
    done = finished(fake_vllm, constrained(chat=True, regex="[0-9]+"), ["12", "3"])
    assert done.stop_note == "" and done.figures["constraint_valid"] == 1.0
    done = finished(fake_vllm, RunSettings(prompt="Hi"), ["any", "thing"])  # no constraint: no figure
    assert done.stop_note == "" and "constraint_valid" not in done.figures


def test_a_fenced_json_reply_is_named(fake_vllm):
    done = finished(fake_vllm, constrained(chat=True, json_schema=json.dumps(SCHEMA)),
                    ["```", '{"name": "A", "age": 1}'])
    assert "Markdown code fence" in done.stop_note and done.figures["constraint_valid"] == 0.0
