"""Constrained greedy on the default model vs llama-server's constrained greedy on the same weights (its Q4_1 GGUF,
which our engine runs dequantized in float32): the cases and the comparison, shared by
``tests/test_remote_grammar_llama.py`` (asserts what is robust) and ``benchmarks/bench_grammar_server.py`` (prints
the figures).

Each case runs four times: local and server, unconstrained and constrained, greedy. The unconstrained pair says
whether the two engines agree on the prompt at all (llama.cpp multiplies Q8_1-quantized activations: they part at
near-ties); the constrained pair is then compared token by token. A parting is put down to the engines' numbers when
the local model's two candidates there (its pick and the server's) are within ``NEAR_TIE_NATS`` of each other, or
when the server's own raw numbers rank the pair the other way (the engines' unconstrained choices between the two
disagree); any other parting is a disagreement between the two constraints.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from playground.config import RunSettings
from playground.config.samplers.grammar import GrammarSettings
from playground.events import RunFinished, RunStarted, TokenStep
from playground.events.remote import RemoteTokenStep
from playground.remote.constraint import check_reply
from playground.remote.decode import run_remote
from playground.remote.source import RemoteSource

NEAR_TIE_NATS = 0.35  # as tests/test_remote_llama.py: a greedy parting between tokens this close is the numbers'


@dataclass(frozen=True)
class Case:
    name: str
    prompt: str
    constraint: dict[str, Any]
    chat: bool = False
    max_new_tokens: int = 16


GBNF_CASES = [
    Case("yes/no/maybe", "Q: Is the sky blue?\nA:", dict(grammar='root ::= " yes" | " no" | " maybe"')),
    Case("choices (converted)", "The best pet is a", dict(choices=(" cat", " dog", " fish", " horse"))),
    Case("arithmetic", "Q: What is 12 plus 30?\nA:",
         dict(grammar='root ::= " " num (" " op " " num)* "."\nnum ::= [0-9]+\nop ::= [-+*/=]')),
    Case("date", "Neil Armstrong walked on the moon on",
         dict(grammar='root ::= " " [0-9]{4} "-" [0-9]{2} "-" [0-9]{2}')),
    Case("date regex (converted)", "The French revolution began on",
         dict(regex=r" \d{4}-\d{2}-\d{2}")),
    Case("full name", "The first president of the United States was",
         dict(grammar='root ::= " " [A-Z] [a-z]+ " " [A-Z] [a-z]+')),
    Case("colour list", "Three colours of the rainbow:",
         dict(grammar='root ::= " " word ", " word " and " word "."\nword ::= [a-z]+')),
    Case("chat yes/no", "Is water wet? Answer yes or no.", dict(grammar='root ::= "Yes" | "No"'), chat=True),
]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                                         "population": {"type": "integer"}},
        "required": ["city", "country", "population"]}
LIST = {"type": "object", "properties": {"colours": {"type": "array", "items": {"type": "string"}}},
        "required": ["colours"]}
SCHEMA_CASES = [
    Case("person", "A person, as JSON:", dict(json_schema=json.dumps(PERSON)), max_new_tokens=32),
    Case("city", "The capital of France, as JSON:", dict(json_schema=json.dumps(CITY)), max_new_tokens=40),
    Case("colours", "Three colours, as JSON:", dict(json_schema=json.dumps(LIST)), max_new_tokens=32),
]


@dataclass
class Outcome:
    case: Case
    local: list[int]  # constrained greedy token ids
    server: list[int]
    local_text: str
    server_text: str
    local_problem: str  # check_reply on each side's text ("" = conforms)
    server_problem: str
    unconstrained_agree: int  # unconstrained greedy tokens the two agree on before parting
    unconstrained_total: int
    agree: int  # constrained tokens agreed before parting
    parting: Parting | None  # where the constrained runs part (None: they do not)
    gaps: list[float] = field(default_factory=list)  # |local - server| chosen-token probability while they agree

    @property
    def identical(self) -> bool:
        return self.local == self.server and self.local_text == self.server_text


def settings_of(case: Case, constrained: bool) -> RunSettings:
    settings = RunSettings(chat=case.chat, prompt=case.prompt, max_new_tokens=case.max_new_tokens,
                           num_candidates=20)
    return settings.with_group(GrammarSettings(**case.constraint)) if constrained else settings


def _local(lm: Any, settings: RunSettings) -> tuple[list[TokenStep], RunFinished, tuple[int, ...]]:
    from playground.engine.strategies import run_strategy

    events = list(run_strategy(lm, settings))
    done, started = events[-1], events[0]
    assert isinstance(done, RunFinished) and isinstance(started, RunStarted)
    return [e for e in events if isinstance(e, TokenStep)], done, started.prompt_token_ids


def logit_gap(lm: Any, context: list[int], mine: int, theirs: int) -> float:
    """The local model's raw log-probability of ``mine`` over ``theirs`` after ``context`` (a fresh forward pass
    over the whole context: the server's pick may lie far outside the recorded candidates under a mask)."""
    import torch

    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([context])).logits[0, -1].float()
    return float(logits[mine] - logits[theirs])


def _server(url: str, settings: RunSettings, eos: int) -> tuple[list[RemoteTokenStep], RunFinished]:
    """The server's steps, less the end token it lists last when it ended the answer (llama-server sends the EOS
    it sampled as a step with no text; our engine ends a complete grammar without one: stop reason "grammar")."""
    events = list(run_remote(RemoteSource(base_url=url), settings))
    done = events[-1]
    assert isinstance(done, RunFinished)
    steps = [e for e in events if isinstance(e, RemoteTokenStep)]
    if steps and steps[-1].token_id == eos and not steps[-1].text:
        steps.pop()
    return steps, done


@dataclass(frozen=True)
class Parting:
    at: int  # tokens agreed before it
    gap_nats: float  # the local model's raw log-probability of its pick over the server's there
    # The server's own raw numbers rank its pick above ours (None: ours is not among its candidates): the two
    # engines' unconstrained choices between the two tokens disagree there.
    flipped: bool | None

    @property
    def explained(self) -> bool:
        """Put down to the two engines' numbers (a near-tie, or their raw orders of the pair differ), not to the
        two constraints."""
        if self.gap_nats < -1e-3:  # the local model prefers the server's pick: our constraint forbade it
            return False
        return self.gap_nats < NEAR_TIE_NATS or self.flipped is True


def _parting(lm: Any, prompt: tuple[int, ...], mine: list[TokenStep], theirs: list[RemoteTokenStep]
             ) -> tuple[int, Parting | None, list[float]]:
    """(tokens agreed before parting, the parting (None: none), the chosen tokens' probability gaps while they
    agree). One side ending before the other is a parting no number explains."""
    agree, gaps = 0, []
    for a, b in zip(mine, theirs, strict=False):
        if a.token_id != b.token_id:
            context = [*prompt, *(s.token_id for s in mine[:agree])]
            server = {c.token_id: c.raw_prob for c in b.candidates}
            flipped = server[a.token_id] < b.raw_prob if a.token_id in server else None
            return agree, Parting(agree, logit_gap(lm, context, a.token_id, b.token_id), flipped), gaps
        agree += 1
        gaps.append(abs(a.raw_prob - b.raw_prob))
    return agree, (None if len(mine) == len(theirs) else Parting(agree, math.inf, None)), gaps


def compare(lm: Any, url: str, case: Case, unconstrained: bool = True) -> Outcome:
    """The case on both engines; ``unconstrained``: also both engines' unconstrained greedy (for the figures)."""
    eos = lm.tokenizer.eos_token_id
    free_local: list[TokenStep] = []
    free_server: list[RemoteTokenStep] = []
    free_agree = 0
    if unconstrained:
        free_local, _, prompt = _local(lm, settings_of(case, False))
        free_server, _ = _server(url, settings_of(case, False), eos)
        free_agree, _, _ = _parting(lm, prompt, free_local, free_server)
    mine, mine_done, prompt = _local(lm, settings_of(case, True))
    theirs, their_done = _server(url, settings_of(case, True), eos)
    agree, parting, gaps = _parting(lm, prompt, mine, theirs)
    grammar = settings_of(case, True).group(GrammarSettings)
    return Outcome(
        case=case, local=[s.token_id for s in mine], server=[s.token_id for s in theirs],
        local_text=mine_done.text, server_text=their_done.text,
        local_problem=check_reply(grammar, mine_done.text, complete=mine_done.stop_reason in ("grammar", "eos")),
        server_problem=check_reply(grammar, their_done.text, complete=their_done.stop_reason == "eos"),
        unconstrained_agree=free_agree, unconstrained_total=min(len(free_local), len(free_server)),
        agree=agree, parting=parting, gaps=gaps)


def summary(outcomes: list[Outcome]) -> dict[str, float]:
    return {
        "cases": len(outcomes),
        "identical": sum(o.identical for o in outcomes),
        "tokens_agreed": sum(o.agree for o in outcomes),
        "tokens_compared": sum(max(len(o.local), len(o.server)) for o in outcomes),
        "partings_explained": sum(o.parting is not None and o.parting.explained for o in outcomes),
        "partings_unexplained": sum(o.parting is not None and not o.parting.explained for o in outcomes),
        "local_valid": sum(not o.local_problem for o in outcomes),
        "server_valid": sum(not o.server_problem for o in outcomes),
        "unconstrained_agreed": sum(o.unconstrained_agree for o in outcomes),
        "unconstrained_compared": sum(o.unconstrained_total for o in outcomes),
        "max_prob_gap": max((g for o in outcomes for g in o.gaps), default=0.0),
    }
