"""The one decode loop (``playground.engine.decode``) driven by scripted steps on a tiny model's tokenizer: the
token buffer's rows, the budget cutting a multi-token step, Stop inside a step, token texts read in the prompt's
context, EOS left out of the final text and a strategy's figures kept. References are the tokenizer's own decode of
the whole sequence and lists the test writes."""

from __future__ import annotations

import pytest
import torch

from playground.config import RunSettings
from playground.engine.decode import DecodeLoop, Picked, TokenBuffer
from playground.engine.run_events import RunRecorder


def test_token_buffer_holds_the_prompt_then_each_token_in_every_row():
    buffer = TokenBuffer.of([5, 6, 7], room=4, device=torch.device("cpu"))
    assert buffer.data.shape == (1, 7) and buffer.data.dtype == torch.long
    assert buffer.view.tolist() == [[5, 6, 7]] and buffer.last.tolist() == [[7]]
    buffer.append(8)
    rows = buffer.repeated(3)
    assert rows.view.tolist() == [[5, 6, 7, 8]] * 3 and buffer.view.tolist() == [[5, 6, 7, 8]]
    rows.append([1, 2, 3])  # one token per row (the KV lab's parallel samples)
    rows.append(4)  # one token for every row
    assert rows.view.tolist() == [[5, 6, 7, 8, 1, 4], [5, 6, 7, 8, 2, 4], [5, 6, 7, 8, 3, 4]]
    assert rows.data.dtype == torch.long and rows.last.tolist() == [[4], [4], [4]]
    assert TokenBuffer.of([1], room=-3, device=torch.device("cpu")).data.shape == (1, 1)  # no room: no columns


def _loop(lm, max_new_tokens: int = 6, should_stop=None, prompt: str = "one two") -> DecodeLoop:
    settings = RunSettings(prompt=prompt, chat=False, max_new_tokens=max_new_tokens)
    ids = lm.tokenizer(prompt)["input_ids"]
    return DecodeLoop(lm, settings, RunRecorder(lm, settings, should_stop), ids, prompt)


def _scripted(picks: list[list[int]], stop_at: int | None = None):
    """A step that picks the next scripted tokens (``stop_at``: the step that says Stop came inside it)."""
    seen: list[tuple[int, list[str]]] = []

    def step(index: int, forced: int | None) -> Picked:
        if index == stop_at:
            return Picked([], lambda texts, ms: [], stopped=True)
        return Picked(list(picks[index]), lambda texts, ms: seen.append((index, texts)) or [("step", index, texts)])

    return step, seen


def _word_ids(lm, text: str) -> list[int]:
    return lm.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_step_of_several_tokens_is_cut_at_the_budget(tiny_lm):
    words = _word_ids(tiny_lm, " three four five six seven")
    loop = _loop(tiny_lm, max_new_tokens=4)
    step, seen = _scripted([words[:3], words[3:]])
    out = list(loop.steps(step))
    assert loop.generated == words[:4] and loop.stop_reason == "max_new_tokens"
    assert [index for index, _ in seen] == [0, 1] and [len(texts) for _, texts in seen] == [3, 1]
    assert [o[1] for o in out] == [0, 1]  # what the step's events gave, in order
    assert loop.ids.view[0, len(loop.prompt_ids):].tolist() == words[:4]


def test_stop_inside_a_step_ends_the_run_stopped_keeping_what_came_before(tiny_lm):
    words = _word_ids(tiny_lm, " three four five six")
    loop = _loop(tiny_lm, max_new_tokens=6)
    step, seen = _scripted([words[:2], words[2:3], words[3:]], stop_at=2)
    list(loop.steps(step))
    assert loop.stop_reason == "stopped" and loop.generated == words[:3]
    assert [index for index, _ in seen] == [0, 1]  # the stopped step made no events
    assert loop.finished().stop_reason == "stopped"
    stopped = _loop(tiny_lm, should_stop=lambda: True)
    list(stopped.steps(step))
    assert stopped.stop_reason == "stopped" and stopped.generated == []


def test_token_texts_are_read_in_the_prompts_context(tiny_lm):
    """Each token's text is the decoded sequence's growth (a token's leading space comes out right after the
    prompt), and the final text is the tokenizer's decode of the output."""
    prompt_ids = _loop(tiny_lm).prompt_ids
    words = _word_ids(tiny_lm, " three four")
    loop = _loop(tiny_lm, max_new_tokens=len(words))
    step, seen = _scripted([[w] for w in words])
    list(loop.steps(step))
    texts = [t for _, ts in seen for t in ts]
    decode = tiny_lm.tokenizer.decode
    expected = [decode(prompt_ids + words[: i + 1])[len(decode(prompt_ids + words[:i])):] for i in range(len(words))]
    assert texts == expected and "".join(texts) == decode(prompt_ids + words)[len(decode(prompt_ids)):]
    assert loop.finished().text == decode(words, skip_special_tokens=True)


def test_eos_ends_the_run_and_stays_out_of_the_final_text(tiny_lm):
    words = _word_ids(tiny_lm, " three four")
    eos = sorted(tiny_lm.eos_token_ids)[0]
    loop = _loop(tiny_lm, max_new_tokens=8)
    step, _ = _scripted([words[:1], [words[1], eos, words[0]], words])
    list(loop.steps(step))
    assert loop.generated == [*words[:2], eos] and loop.stop_reason == "eos"
    done = loop.finished({"speedup": 1.5}, sequences=())
    assert tiny_lm.tokenizer.decode([eos]) not in done.text
    assert done.text == tiny_lm.tokenizer.decode(words[:2]) and done.figures == {"speedup": 1.5}
    assert done.token_ids == (*words[:2], eos) and done.cut_short == ()


def test_a_prompt_near_the_context_end_cuts_the_budget(tiny_lm):
    settings = RunSettings(prompt="x", chat=False, max_new_tokens=50)
    room = 20
    prompt_ids = [5] * (tiny_lm.context_length - room)
    loop = DecodeLoop(tiny_lm, settings, RunRecorder(tiny_lm, settings), prompt_ids, "x")
    assert loop.max_steps == room and loop.stop_reason == loop.budget_reason == "context_full"
    assert loop.ids.data.shape == (1, tiny_lm.context_length)
    assert _loop(tiny_lm, max_new_tokens=5).budget_reason == "max_new_tokens"


@pytest.mark.parametrize("forced", [(), (7, 8)])
def test_forced_tokens_are_offered_by_position(tiny_lm, forced):
    settings = RunSettings(prompt="one two", chat=False, max_new_tokens=3, forced_token_ids=forced)
    ids = tiny_lm.tokenizer("one two")["input_ids"]
    loop = DecodeLoop(tiny_lm, settings, RunRecorder(tiny_lm, settings), ids, "one two")
    offered = []

    def step(index: int, token: int | None) -> Picked:
        offered.append(token)
        return Picked([token if token is not None else 9], lambda texts, ms: [])

    list(loop.steps(step))
    assert offered == [*forced, *[None] * (3 - len(forced))]
